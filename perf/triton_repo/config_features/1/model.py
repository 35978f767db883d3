import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """INPUT (reshaped to [2, 2] for the model) back as OUTPUT: a model whose config uses
    many of the fields a config can have, for perf/compat_probe.py to compare how both
    servers render and honour them."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT", pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy())])
            for request in requests]
