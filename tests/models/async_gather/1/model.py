import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled, `async def execute`, one instance. Each request waits (up to 10 s) until
    COUNT requests are in execute at once, then answers PEAK, the most it saw since none
    was, and the final flag; a negative COUNT raises instead. Requests overlap only if the instance takes the
    next batch while earlier coroutines still run (Triton runs them on a background loop)."""

    def initialize(self, args):
        self.running = 0
        self.peak = 0
        self.changed = None

    async def execute(self, requests):
        if self.changed is None:
            self.changed = asyncio.Condition()
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            if count < 0:
                raise pb_utils.TritonModelException("async_gather was told to fail")
            sender = request.get_response_sender()
            async with self.changed:
                self.running += 1
                self.peak = max(self.peak, self.running)
                self.changed.notify_all()
                try:
                    await asyncio.wait_for(
                        self.changed.wait_for(lambda count=count: self.peak >= count), 10)
                except asyncio.TimeoutError:
                    pass
                peak = self.peak
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PEAK", np.array([peak], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            async with self.changed:
                self.running -= 1
                if not self.running:
                    self.peak = 0  # the next requests count anew
        return None
