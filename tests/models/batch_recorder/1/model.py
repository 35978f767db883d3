import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# The longest a request waits for its `hold_until` file, so a test that fails to create it
# cannot stall the instance for good.
HOLD_LIMIT_S = 30.0


class TritonPythonModel:
    """OUTPUT0 = INPUT0, plus what the batcher made of each execute call: BATCH (its total batch
    size), REQUESTS (its number of requests), INSTANCE (the instance that ran it), START and END
    (time.time() around the work). So that a test can hold the instance while more requests
    queue up, a call first waits until the file named by any of its requests' `hold_until`
    parameter exists (after creating `<hold_until>.held-<instance>`, which tells the test that
    the instance holds), then sleeps the largest DELAY of the call (seconds). Shared by every
    batch_* test model."""

    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        deadline = time.monotonic() + HOLD_LIMIT_S
        for request in requests:
            path = json.loads(request.parameters()).get("hold_until")
            if path:
                open(f"{path}.held-{self.instance}", "w").close()
            while path and not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.002)
        start = time.time()
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        delays = [pb_utils.get_input_tensor_by_name(r, "DELAY") for r in requests]
        time.sleep(max((float(d.as_numpy().max()) for d in delays if d is not None), default=0.0))
        end = time.time()
        batch = sum(x.shape[0] for x in inputs)
        responses = []
        for x in inputs:
            column = (x.shape[0], 1)  # every output but OUTPUT0 is one value per batch row
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("BATCH", np.full(column, batch, np.int32)),
                pb_utils.Tensor("REQUESTS", np.full(column, len(requests), np.int32)),
                pb_utils.Tensor("INSTANCE", np.full(column, self.instance.encode(), np.object_)),
                pb_utils.Tensor("START", np.full(column, start, np.float64)),
                pb_utils.Tensor("END", np.full(column, end, np.float64)),
            ]))
        return responses
