"""Triton's header forwarding (`--http-header-forward-pattern`, `--grpc-header-forward-pattern`):
request headers whose names match a regular expression reach the model as request
parameters (string values), which `request.parameters()` shows it.

Names are matched case-insensitively (HTTP/1.1 header names have no case; gRPC's are lower
case) anywhere in the name, and forwarded lower case. A header never replaces a parameter
the request itself carries; one that names a parameter the server acts on (sequence_id,
priority, timeout, ...) or a `triton_` one fails the request, as in Triton since 2.69 (a
header must not change how a request is scheduled).
"""

import re

from shmserve.admission import RESERVED_PARAMETERS
from shmserve.errors import Code, ServerError
from shmserve.inference import InferRequest


def compile_pattern(pattern: str | None):
    """The compiled pattern, or None when forwarding is off; re.error for a bad one."""
    return None if not pattern else re.compile(pattern, re.IGNORECASE)


def forward(request: InferRequest, headers, pattern) -> None:
    """Add the (name, value) pairs of `headers` that `pattern` matches to the parameters."""
    params = request.parameters
    for name, value in headers:
        name = name.lower()
        if not pattern.search(name):
            continue
        if name in RESERVED_PARAMETERS or name.startswith("triton_"):
            raise ServerError(Code.INVALID_ARG, f"Header '{name}' is reserved for Triton usage "
                                                f"and cannot be forwarded.")
        if name not in params:
            params[name] = value
