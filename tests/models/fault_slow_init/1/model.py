import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """`initialize` takes 2 s: long enough for a test to kill the worker while it loads."""

    def initialize(self, args):
        time.sleep(2.0)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
