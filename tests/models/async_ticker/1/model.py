import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Not decoupled, `async def execute`: its first call starts a task that counts every
    10 ms; each request answers TICKS, the count so far. The task runs between calls only
    if the instance's event loop runs on its own (as in Triton)."""

    def initialize(self, args):
        self.ticks = 0
        self.ticker = None

    async def _tick(self):
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def execute(self, requests):
        if self.ticker is None:
            self.ticker = asyncio.get_running_loop().create_task(self._tick())
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("TICKS", np.array([self.ticks], np.int64))]) for _ in requests]
