import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Negates INPUT0 where it lies, when the model may write there, and returns it as
    OUTPUT0. A client that finds its own input region negated knows the model was handed its
    memory rather than a copy."""

    def execute(self, requests):
        responses = []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            writable = bool(array.flags.writeable)
            if writable:
                np.negative(array, out=array)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", array),
                pb_utils.Tensor("WRITABLE", np.array([writable])),
            ]))
        return responses
