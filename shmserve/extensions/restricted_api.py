"""Triton's restricted APIs (`--http-restricted-api`, `--grpc-restricted-protocol`): groups
of endpoints that answer only requests carrying a given header with a given value (HTTP
403, gRPC UNAVAILABLE, "This API is restricted, expecting header '<header>'"), so that, for
one, model loading can be kept from the clients that may infer.

A flag's value is `<category>[,<category>...]:<header>=<value>`; a category may be named by
one flag only. Header names compare without case.
"""

CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config",
              "model-repository", "statistics", "trace", "logging")


class RestrictionError(ValueError):
    pass


def parse_restrictions(values: list) -> dict:
    """{category: (header lower case, value)} from the flag's values."""
    out = {}
    for text in values:
        categories, sep, condition = text.partition(":")
        header, eq, value = condition.partition("=")
        if not sep or not eq or not header or not categories:
            raise RestrictionError(f"expected '<category>[,<category>...]:<header>=<value>', "
                                   f"got '{text}'")
        for category in categories.split(","):
            category = category.strip()
            if category not in CATEGORIES:
                raise RestrictionError(f"unknown API category '{category}' (one of "
                                       f"{', '.join(CATEGORIES)})")
            if category in out:
                raise RestrictionError(f"API category '{category}' is restricted twice")
            out[category] = (header.strip().lower(), value)
    return out


def refusal(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


def allowed(restriction: tuple, headers) -> bool:
    """Whether (name, value) pairs `headers` carry the restriction's header and value."""
    header, value = restriction
    return any(name.lower() == header and given == value for name, given in headers)
