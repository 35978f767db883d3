"""A model's `parameters` as framework backends read them, and the thread budget they share.

Triton's backends read a parameter's `string_value` by exact key and convert it with the same
rules and error texts (backend/src/backend_common.cc: ParseIntValue, ParseBoolValue); a bad
value fails the load naming the parameter.
"""

import os

from workers.backends import BackendError


def string_parameters(config: dict) -> dict:
    """{key: string value} of a config's `parameters`."""
    return {key: value.get("string_value", "") if isinstance(value, dict) else str(value)
            for key, value in (config.get("parameters") or {}).items()}


def int_parameter(parameters: dict, key: str, model: str, default: int) -> int:
    if key not in parameters:
        return default
    try:
        return int(parameters[key].strip())
    except ValueError:
        raise BackendError(f"unable to load model '{model}': parameter '{key}': failed to "
                           f"convert '{parameters[key]}' to integral number") from None


def bool_parameter(parameters: dict, key: str, model: str):
    """True, False, or None when the parameter is not given (the framework's default then)."""
    if key not in parameters:
        return None
    value = parameters[key].strip().lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise BackendError(f"unable to load model '{model}': parameter '{key}': failed to convert "
                       f"'{parameters[key]}' to boolean")


def instance_count(config: dict) -> int:
    """How many instances the model runs on this machine."""
    count = 0
    for group in config.get("instance_group") or []:
        devices = len(group.get("gpus") or []) if group.get("kind") == "KIND_GPU" else 1
        count += int(group.get("count") or 1) * max(devices, 1)
    return max(count, 1)


def default_intra_op_threads(config: dict) -> int:
    """The cores this process may run on, shared among the model's instances: several
    instances, each with its framework's default of a thread per core, would oversubscribe
    them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // instance_count(config))
