import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT_<T> = IN_<T> for every input the request carries (all inputs are optional)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                out_name = "OUT_" + tensor.name().removeprefix("IN_")
                if tensor.name() == "IN_BF16":
                    # as_numpy() has no BF16 in Triton: the bytes travel through DLPack.
                    outputs.append(pb_utils.Tensor.from_dlpack(out_name, tensor.to_dlpack()))
                else:
                    outputs.append(pb_utils.Tensor(out_name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
