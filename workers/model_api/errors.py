"""The errors of the model API: TritonModelException, which models raise (and pb_utils raises
for misuse), and TritonError, the error a response carries, with its codes."""

import enum


class TritonModelException(Exception):
    """The exception type models raise; also raised by pb_utils for misuse."""


class _ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    # Printed as the Python backend's pybind enum prints its codes.
    def __str__(self):
        return f"__ErrorCode.{self.name}"

    def __format__(self, spec):
        return format(str(self), spec)

    def __repr__(self):
        return f"<__ErrorCode.{self.name}: {self.value}>"


class TritonError:
    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message, code=_ErrorCode.INTERNAL):
        if message is None:
            raise TypeError("TritonError message must not be None")
        self._message = str(message)
        self._code = _ErrorCode(code)

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r}, code={self._code.name})"
