import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, by asking identity_fp32 (BLS, one call per request): what a model
    calling another costs, tensors both ways."""

    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="identity_fp32", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")]))
        return responses
