"""gRPC status codes (grpc/doc/statuscodes.md), and the error that ends a call with one."""

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14


class RpcError(Exception):
    """Ends a call with a gRPC status; raised by handlers and by the gRPC layer."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
