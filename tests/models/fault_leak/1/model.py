import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Leaks: every request keeps `MB` megabytes (written, so resident) for good; `HELD_MB` is
    the total it holds."""

    def initialize(self, args):
        self._kept = []

    def execute(self, requests):
        responses = []
        for request in requests:
            mb = int(pb_utils.get_input_tensor_by_name(request, "MB").as_numpy()[0])
            self._kept.append(np.ones(mb << 20, np.uint8))
            held = sum(a.nbytes for a in self._kept) >> 20
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("HELD_MB", np.array([held], np.int32))]))
        return responses
