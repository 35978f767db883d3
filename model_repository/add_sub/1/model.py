import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 (FP32 [4])."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b),
                pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        return responses
