"""--openai-restricted-api: API groups of the OpenAI routes answered only to requests that
carry a header with a value, as Triton's OpenAI frontend restricts them; others get 401."""

import hmac

import orjson

# Group -> its routes, as (method, path prefix).
GROUPS = {
    "inference": (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                  ("POST", "/v1/embeddings")),
    "model-repository": (("GET", "/v1/models"), ("POST", "/v1/models/")),
    "metrics": (("GET", "/metrics"),),
    "health": (("GET", "/health/ready"),),
}


def parse(settings: list) -> dict:
    """{group: (header, value)} from --openai-restricted-api's [groups, header, value]
    triples (groups separated by commas); ValueError with Triton's words for a group that
    does not exist or is named twice."""
    out: dict = {}
    for groups, header, value in settings:
        for group in groups.split(","):
            if group not in GROUPS:
                raise ValueError(f"Unknown API '{group}'. Available APIs: {list(GROUPS)}")
            if group in out:
                raise ValueError(f"restricted api '{group}' can not be specified in multiple "
                                 f"config groups")
            out[group] = (header, value)
    return out


def refusal(restriction: tuple, headers: dict) -> bytes | None:
    """The 401 body for a request lacking the restriction's header, else None."""
    header, value = restriction
    given = headers.get(header.lower())  # the HTTP layer's names are lower case
    if given is not None and hmac.compare_digest(given.encode(), value.encode()):
        return None
    return orjson.dumps({"error": {
        "message": f"This API is restricted, expecting header '{header}' with valid value",
        "type": "authentication_error", "code": "invalid_auth"}})
