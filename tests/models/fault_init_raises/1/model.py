class TritonPythonModel:
    """`initialize` raises: the model must be UNAVAILABLE with this message, the others load."""

    def initialize(self, args):
        raise RuntimeError("fault_init_raises refuses to initialize")

    def execute(self, requests):
        raise AssertionError("never called")
