"""textgen's request values: how both textgen and textgen_iterative read and check a request
(the latter reaches this file through a symlink, as it does transformer.py)."""

import json
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from .transformer import SamplingParams, Sequence


@dataclass(eq=False)
class Asked:
    """What a request asks for: its sequence (prompt and sampling settings), whether to
    stream, and whether its responses carry token counts (`return_num_input_tokens`,
    `return_num_output_tokens`, as the vLLM and TensorRT-LLM backends take them)."""

    seq: Sequence
    stream: bool
    input_count: bool = False
    output_count: bool = False


class AskedFor:
    """For the records a model keeps per request: their request's sequence and stream flag."""

    asked: Asked

    @property
    def seq(self) -> Sequence:
        return self.asked.seq

    @property
    def stream(self) -> bool:
        return self.asked.stream


def read_request(request, model) -> Asked:
    """What the request asks of `model` (a Transformer): each value from the request's input
    of that name, else from its request parameter, else the default."""
    parameters = json.loads(request.parameters() or "{}")

    def value(name, convert, default):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            array = tensor.as_numpy()
            if array.size != 1:
                raise ValueError(f"input '{name}' must hold one value, not {array.size}")
            return convert(name, array.reshape(-1).tolist()[0])
        if name in parameters:
            return convert(name, parameters[name])
        return default

    prompt = value("text_input", text, None)
    if prompt is None:
        raise ValueError("input 'text_input' is required")
    params = SamplingParams(
        max_tokens=value("max_tokens", integer, 64),
        temperature=value("temperature", number, 1.0),
        top_p=value("top_p", number, 1.0),
        stop=stop_sequences(request, parameters),
        seed=value("seed", integer, None),
    )
    return Asked(Sequence(model.vocab.encode(prompt), params, model.context),
                 value("stream", flag, False), value("return_num_input_tokens", flag, False),
                 value("return_num_output_tokens", flag, False))


def text_response(asked: Asked, text: str, batched: bool):
    """A response holding `text` as text_output, with the token counts the request asked for:
    the prompt's, and the text's (one token is one character)."""
    shape = (1, 1) if batched else (1,)

    def tensor(name, value, dtype):
        return pb_utils.Tensor(name, np.array([value], dtype=dtype).reshape(shape))

    tensors = [tensor("text_output", text.encode("utf-8"), np.object_)]
    if asked.input_count:
        tensors.append(tensor("num_input_tokens", len(asked.seq.prompt_ids), np.uint32))
    if asked.output_count:
        tensors.append(tensor("num_output_tokens", len(text), np.uint32))
    return pb_utils.InferenceResponse(output_tensors=tensors)


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
