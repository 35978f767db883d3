"""textgen's request values: the checks both textgen and textgen_iterative apply (the
latter reaches this file through a symlink, as it does transformer.py)."""

import triton_python_backend_utils as pb_utils


def text(name, value) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"input '{name}' is not valid UTF-8") from None
    if isinstance(value, str):
        return value
    raise ValueError(f"'{name}' must be a string, not {value!r}")


def integer(name, value) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{name}' must be an integer, not {value!r}")
    return value


def number(name, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{name}' must be a number, not {value!r}")
    return float(value)


def flag(name, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"'{name}' must be true or false, not {value!r}")
    return value


def stop_sequences(request, parameters) -> tuple:
    tensor = pb_utils.get_input_tensor_by_name(request, "stop")
    if tensor is not None:
        values = tensor.as_numpy().reshape(-1).tolist()
    else:
        values = parameters.get("stop", [])
        if not isinstance(values, list):
            values = [values]
    return tuple(text("stop", v) for v in values)
