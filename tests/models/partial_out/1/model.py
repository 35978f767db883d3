import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A = MODE, and B = [1, 2, 3, 4] only when MODE is 0: a model that leaves an output out."""

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
            outputs = [pb_utils.Tensor("A", mode.astype(np.int32))]
            if mode[0] == 0:
                outputs.append(pb_utils.Tensor("B", np.arange(1, 5, dtype=np.float32)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
