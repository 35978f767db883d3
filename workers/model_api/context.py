"""The model instance's context: what the Python backend tells the model API about the
instance it runs (its folder and name, the channel into the server, whether BLS calls may be
made now). One object, CONTEXT, holds it for every module of the package: the setters below
are what the worker calls (through triton_python_backend_utils), the other modules read
CONTEXT's attributes when they need them."""


class _Context:
    __slots__ = ("model_dir", "instance_name", "server_calls", "bls_allowed")

    def __init__(self):
        self.model_dir = ""
        self.instance_name = ""  # as Triton's stub names it in errors
        self.server_calls = None  # workers.server_calls.FrameReader of this worker
        # Whether the instance is past initialize() and not in finalize(): BLS calls are only
        # made then, as in Triton (the backend says when).
        self.bls_allowed = False


CONTEXT = _Context()


def get_model_dir():
    """The folder holding the model's Python file (`<repository>/<model>/<version>`)."""
    return CONTEXT.model_dir


def _set_model_context(*, model_dir: str, instance_name: str = "") -> None:
    CONTEXT.model_dir = model_dir
    CONTEXT.instance_name = instance_name


def _set_server_calls(reader) -> None:
    CONTEXT.server_calls = reader


def _allow_bls(allowed: bool) -> None:
    CONTEXT.bls_allowed = allowed
