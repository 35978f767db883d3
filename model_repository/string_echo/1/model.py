import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 for a 1-D BYTES tensor (numpy object array of bytes)."""

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            ])
            for request in requests
        ]
