"""The parameters of requests and responses: what a model may set, and the JSON it reads."""

from workers.model_api.errors import TritonModelException


# Triton hands parameters() to the model as compact JSON: {"k":"v","n":7}.
_COMPACT = (",", ":")


def _parameters_dict(parameters) -> dict:
    """Validated copy of model-supplied parameters: str keys, bool/int/str values."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters)
