import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """execute() always raises: every request of the batch gets an INTERNAL error."""

    def execute(self, requests):
        raise pb_utils.TritonModelException("raiser always fails")
