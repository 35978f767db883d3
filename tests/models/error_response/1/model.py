import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """execute() succeeds, but each response carries an INVALID_ARG error instead of outputs."""

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(error=pb_utils.TritonError("bad thing", pb_utils.TritonError.INVALID_ARG))
            for _ in requests
        ]
