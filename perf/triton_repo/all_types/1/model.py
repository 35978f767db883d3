import triton_python_backend_utils as pb_utils

DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES")


class TritonPythonModel:
    """Every input it is given (each optional, one a datatype) back as the output of that
    datatype, for perf/compat_probe.py to compare how both servers take and give each."""

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for datatype in DATATYPES:
                tensor = pb_utils.get_input_tensor_by_name(request, "IN_" + datatype)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor("OUT_" + datatype, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
