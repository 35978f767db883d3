"""The one error type of the server.

Everything below the transports raises `ServerError` with a Triton error code; only the
transports map codes to HTTP or gRPC statuses.
"""

import enum


class Code(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


class ServerError(Exception):
    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self):
        return f"ServerError({self.code.name}, {self.message!r})"


class ReadError(ServerError):
    """An error Triton finds while it reads a request, before the model validates it (an
    input or output the model lacks, a bad region, a bad scheduling parameter): unlike
    validation errors, its message does not name the request."""


class BackendReadError(ReadError):
    """An error Triton's backend finds as it reads a request the server took (a BYTES
    element cut short): the request counts as a failure of the model."""


class Refused(ServerError):
    """A request a scheduler turned away as it arrived, for what the request itself says (a
    sequence request without its ID or START flag): like a validation failure, Triton counts
    it in no statistics."""


class ModelError(ServerError):
    """An error that came back as the request's answer (the model's own, its instance's
    failure, an ensemble step's), not the server refusing the request before a model ran
    it: Triton's Python backend words the two differently to a model calling another.
    `answered`: the model answered with it (an InferenceResponse carrying an error), which
    Triton counts as a successful request, where an execute that raised is a failure."""

    def __init__(self, code: Code, message: str, answered: bool = False):
        super().__init__(code, message)
        self.answered = answered


# How Triton's Status prints each code ("Invalid argument: ...").
_CODE_WORDS = {Code.UNKNOWN: "Unknown", Code.INTERNAL: "Internal", Code.NOT_FOUND: "Not found",
               Code.INVALID_ARG: "Invalid argument", Code.UNAVAILABLE: "Unavailable",
               Code.UNSUPPORTED: "Unsupported", Code.ALREADY_EXISTS: "Already exists",
               Code.CANCELLED: "Cancelled"}


def status_text(error: ServerError) -> str:
    """The error as Triton prints a Status: its code in words, then its message (the
    reason a model version failed to load, say)."""
    return f"{_CODE_WORDS[error.code]}: {error.message}"


def invalid_arg(message: str) -> ServerError:
    return ServerError(Code.INVALID_ARG, message)


def internal(message: str) -> ServerError:
    return ServerError(Code.INTERNAL, message)
