"""How an OpenAI request becomes a request to a repository model, and its responses text,
token counts and embeddings: the tensor conventions of Triton's OpenAI frontend.

A model whose backend is `vllm` gets the vLLM backend's inputs (`text_input`, `stream`,
`sampling_parameters` as JSON, `exclude_input_in_output`, `return_num_input_tokens`,
`return_num_output_tokens`); every other model gets TensorRT-LLM's names (`text_input`,
`stream`, `max_tokens`, `stop_words`, `top_p`, `temperature`, `seed`, `frequency_penalty`,
`presence_penalty`, the echo and token-count switches), plus `stop` for stop sequences when
the model has no `stop_words`. Unlike Triton's frontend, a model is sent only the inputs it
declares, each with the datatype and shape its config gives: a sampling option it cannot take
is left out, as OpenAI lets a model do, and an option whose absence would change the answer
(stop sequences) is refused. The answer is the `text_output` output; `num_input_tokens` and
`num_output_tokens`, where the model gives them, make `usage`.

Embeddings: a model with a BYTES input `text_input` and an output `embedding` (a vector of
numbers) answers /v1/embeddings (the vLLM backend's `embedding_request` -> JSON `text_output`
too); other models get Triton's 400.
"""

import json
import struct
from dataclasses import dataclass

import numpy as np

from shmserve.errors import ServerError
from shmserve.http.codec import output_values
from shmserve.http.generate import input_tensor
from shmserve.inference import InferRequest, InferResponse, InputTensor
from shmserve.ipc import datatypes
from shmserve.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from shmserve.signature import ModelSignature

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
EMBEDDING_OUTPUT = "embedding"
ECHO_INPUTS = ("exclude_input_in_output", "sampling_param_exclude_input_from_output")

# Triton's frontend's words.
NO_EMBEDDINGS = "TRT-LLM backend and Python backend do not support embedding requests"

# Request fields that are not vLLM sampling parameters (Triton's frontend's list).
_NOT_SAMPLING = {"model", "stream", "messages", "prompt", "echo", "store", "metadata",
                 "response_format", "service_tier", "stream_options", "tools", "tool_choice",
                 "parallel_tool_calls", "user", "function_call", "functions", "suffix",
                 "max_completion_tokens", "max_tokens", "logprobs", "top_logprobs", "best_of"}


class RouteError(Exception):
    """An answer other than 200: `status` with FastAPI's body {"detail": detail}."""

    def __init__(self, status: int, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class TextModel:
    """What the routes need to know of a repository model."""

    name: str
    backend: str
    signature: ModelSignature
    decoupled: bool

    @property
    def vllm(self) -> bool:
        return self.backend == "vllm"

    def takes(self, name: str) -> bool:
        return name in self.signature.inputs

    def echo_input(self) -> str | None:
        return next((n for n in ECHO_INPUTS if n in self.signature.inputs), None)


def generation_request(model: TextModel, prompt: str,
                       body: CompletionRequest | ChatCompletionRequest,
                       default_max_tokens: int) -> tuple[InferRequest, bool]:
    """The model's request for a completion of `prompt`, and whether the routes must echo
    the prompt themselves (echo asked of a model without an echo input)."""
    if not model.takes(TEXT_INPUT):
        raise RouteError(400, f"model '{model.name}' has no input '{TEXT_INPUT}': it does not "
                              f"generate text")
    max_tokens = _max_tokens(body, default_max_tokens)
    echo = getattr(body, "echo", None)
    echo_input = model.echo_input()
    values: dict = {TEXT_INPUT: prompt, "stream": bool(body.stream)}
    if echo_input is not None:
        values[echo_input] = not echo
    if model.vllm:
        sampling = body.model_dump(exclude=_NOT_SAMPLING, exclude_none=True)
        sampling["max_tokens"] = max_tokens
        values["sampling_parameters"] = json.dumps(sampling)
        if echo_input is None and "exclude_input_in_output" not in values:
            values["exclude_input_in_output"] = not echo
    else:
        values["max_tokens"] = max_tokens
        stops = [body.stop] if isinstance(body.stop, str) else body.stop
        if stops:
            target = "stop_words" if model.takes("stop_words") else "stop"
            if not model.takes(target):
                raise RouteError(400, f"model '{model.name}' takes no stop sequences (it has "
                                      f"no input 'stop_words' or 'stop')")
            values[target] = stops
        for name in ("top_p", "frequency_penalty", "presence_penalty", "seed", "temperature"):
            value = getattr(body, name)
            if value is not None:
                values[name] = value
    # Token counts are asked for only where the answer shows them: every response of a
    # stream would carry them, which costs a model two more outputs per token
    # (perf/bench_openai.py).
    counts = not body.stream or bool(body.stream_options and body.stream_options.include_usage)
    values["return_num_input_tokens"] = counts
    values["return_num_output_tokens"] = counts
    request = InferRequest(model_name=model.name)
    _fill(request, model, values)
    return request, bool(echo) and echo_input is None


def embedding_request(model: TextModel, body: EmbeddingRequest) -> InferRequest:
    request = InferRequest(model_name=model.name)
    if model.vllm and model.takes("embedding_request"):
        pooling = {} if body.dimensions is None else {"dimensions": [body.dimensions]}
        _fill(request, model, {"embedding_request": json.dumps(
            {"input": body.input, "pooling_params": pooling}),
            "return_num_input_tokens": True, "return_num_output_tokens": True})
        return request
    if not (model.takes(TEXT_INPUT) and EMBEDDING_OUTPUT in model.signature.outputs):
        raise RouteError(400, NO_EMBEDDINGS)
    if not isinstance(body.input, str):
        raise RouteError(400, f"model '{model.name}' takes its input as text: send `input` as "
                              f"a string")
    values: dict = {TEXT_INPUT: body.input, "return_num_input_tokens": True}
    if body.dimensions is not None:
        values["dimensions"] = body.dimensions
    _fill(request, model, values)
    return request


def _max_tokens(body, default: int) -> int:
    value = getattr(body, "max_completion_tokens", None)
    if value is None:
        value = body.max_tokens
    return default if value is None else value


def _fill(request: InferRequest, model: TextModel, values: dict) -> None:
    """The model's inputs among `values`, each as its config declares it."""
    batched = model.signature.max_batch_size > 0
    for name, value in values.items():
        spec = model.signature.inputs.get(name)
        if spec is None:
            continue
        try:
            request.inputs.append(_one_value(spec, value, batched)
                                  or input_tensor(spec, value, batched))
        except ServerError as exc:
            raise RouteError(400, f"model '{model.name}' cannot take '{name}' as it declares "
                                  f"it: {exc.message}") from None
        except (struct.error, OverflowError):  # a number the datatype cannot hold
            raise RouteError(400, f"model '{model.name}' cannot take '{name}' = {value!r} as "
                                  f"{spec.datatype}") from None


# One value as each datatype's wire bytes (little-endian); struct.error for one it cannot hold.
_PACK = {name: struct.Struct("<" + code).pack for name, code in (
    ("BOOL", "?"), ("INT8", "b"), ("INT16", "h"), ("INT32", "i"), ("INT64", "q"),
    ("UINT8", "B"), ("UINT16", "H"), ("UINT32", "I"), ("UINT64", "Q"), ("FP16", "e"),
    ("FP32", "f"), ("FP64", "d"))}


def _one_value(spec, value, batched: bool) -> InputTensor | None:
    """The input holding one value, for an input of one element: most of a request's inputs,
    made here without the general JSON conversion, which costs several times more. None for
    anything else (a list, a value of another kind than the datatype)."""
    if isinstance(value, list):
        return None
    shape = [1 if d < 0 else d for d in spec.dims]
    if datatypes.element_count(shape) != 1:
        return None
    datatype = spec.datatype
    if datatype == "BYTES":
        if not isinstance(value, str):
            return None
        data = datatypes.serialize_bytes((value,))
    elif datatype not in _PACK or (datatype == "BOOL") != isinstance(value, bool) \
            or not isinstance(value, (bool, int, float)):
        return None
    else:
        if isinstance(value, float) and datatype.startswith(("INT", "UINT")):
            return None
        data = _PACK[datatype](value)
    if batched:
        shape.insert(0, 1)
    return InputTensor(spec.name, datatype, shape, data)


def text_of(response: InferResponse) -> str:
    for out in response.outputs:
        if out.name == TEXT_OUTPUT and out.datatype == "BYTES":
            return "".join(output_values(out, "replace"))
    return ""


def token_counts(response: InferResponse) -> tuple[int | None, int | None]:
    """(num_input_tokens, num_output_tokens) where the response has them: the first element
    of each, an integer of any width (read for every streamed token, so without numpy)."""
    prompt = output = None
    for out in response.outputs:
        if out.name == "num_input_tokens":
            prompt = _first_int(out)
        elif out.name == "num_output_tokens":
            output = _first_int(out)
    return prompt, output


_INTEGERS = {"INT8": (1, True), "INT16": (2, True), "INT32": (4, True), "INT64": (8, True),
             "UINT8": (1, False), "UINT16": (2, False), "UINT32": (4, False),
             "UINT64": (8, False)}


def _first_int(out) -> int | None:
    size, signed = _INTEGERS.get(out.datatype, (0, False))
    if not size or len(out.data) < size:
        return None
    return int.from_bytes(out.data[:size], "little", signed=signed)


def embedding_of(model: TextModel, response: InferResponse) -> list[float]:
    for out in response.outputs:
        if model.vllm and out.name == TEXT_OUTPUT:
            try:
                vector = json.loads(text_of(response))
            except ValueError:
                vector = None
            if isinstance(vector, list) and vector and isinstance(vector[0], list):
                vector = vector[0]
            if not isinstance(vector, list):
                raise RouteError(500, f"model '{model.name}' answered no embedding")
            return [float(v) for v in vector]
        if out.name == EMBEDDING_OUTPUT and out.datatype not in ("BYTES", "BOOL"):
            if out.datatype == "BF16":  # the upper half of a float32
                raw = np.frombuffer(out.data, np.uint16).astype(np.uint32) << 16
                return raw.view(np.float32).tolist()
            if out.datatype == "FP16":
                return np.frombuffer(out.data, np.float16).astype(np.float32).tolist()
            return [float(v) for v in output_values(out, "replace")]
    raise RouteError(500, f"model '{model.name}' answered no '{EMBEDDING_OUTPUT}' output")
