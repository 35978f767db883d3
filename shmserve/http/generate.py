"""HTTP generate codec: Triton's flat generate JSON <-> inference.py, plus SSE framing.

A generate request has no tensor metadata: each key of the body (and of its "parameters"
object) is an input when the model has an input of that name, else a request parameter.
Datatype and shape therefore come from the model's signature. The response flattens the
outputs and response parameters into one JSON object.

BYTES outputs that are not valid UTF-8 are decoded with U+FFFD replacing each bad sequence:
generate has no binary alternative, and a stream of text tokens may split a character
across responses, so a readable string beats failing the whole response.
"""

import orjson

from shmserve.errors import invalid_arg
from shmserve.http.codec import (json_input_bytes, json_number, json_numbers, json_object,
                                 output_values)
from shmserve.inference import InferRequest, InferResponse, InputTensor, OutputTensor
from shmserve.ipc import datatypes
from shmserve.signature import ModelSignature, TensorSpec

_RESPONSE_KEYS = ("id", "model_name", "model_version")


def decode_generate_request(
    body: bytes | memoryview, model_name: str, model_version: str, signature: ModelSignature
) -> InferRequest:
    """Parse a generate body. The request asks for every output of the model."""
    doc = json_object(body)

    request_id = doc.pop("id", "")
    if type(request_id) is not str:
        raise invalid_arg("Unable to parse 'id'")
    nested = doc.pop("parameters", None)
    if nested is None:
        nested = {}
    elif type(nested) is not dict:
        raise invalid_arg("Unable to parse 'parameters'")
    clash = nested.keys() & doc.keys()
    if clash:
        raise invalid_arg(f"'{min(clash)}' is given both at the top level and in 'parameters'")

    request = InferRequest(model_name=model_name, model_version=model_version, id=request_id)
    batched = signature.max_batch_size > 0
    for members in (doc, nested):
        for key, value in members.items():
            spec = signature.inputs.get(key)
            if spec is not None:
                request.inputs.append(_input(spec, value, batched))
            else:
                request.parameters[key] = _parameter(key, value, model_name)
    return request


def encode_generate_response(response: InferResponse) -> bytes:
    """The response as one flat JSON object. Outputs and parameters never replace the id,
    model name or version, and outputs win over parameters of the same name."""
    doc = {"id": response.id} if response.id else {}
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    for out in response.outputs:
        if out.name not in _RESPONSE_KEYS:
            doc[out.name] = _output_value(out)
    for key, value in response.parameters.items():
        if key not in _RESPONSE_KEYS:
            doc.setdefault(key, value)
    # Keys sorted, as Triton writes them.
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)


def sse_data(payload: bytes) -> bytes:
    """One Server-Sent Event carrying a JSON payload (orjson never emits a newline)."""
    return b"data: " + payload + b"\n\n"


def sse_error(message: str) -> bytes:
    """The event that reports a failure once the stream's 200 status is already sent."""
    return sse_data(orjson.dumps({"error": message}))


def _input(spec: TensorSpec, value, batched: bool) -> InputTensor:
    name = spec.name
    if type(value) is not list:
        value = [value]
    elif value and type(value[0]) is list:
        raise invalid_arg(f"input '{name}' must be a JSON scalar or a 1-D array")
    shape = _shape(spec, len(value))
    if batched:
        shape.insert(0, 1)
    data = json_input_bytes(name, spec.datatype, shape, value)
    return InputTensor(name, spec.datatype, shape, data)


def _shape(spec: TensorSpec, count: int) -> list[int]:
    """The config dims with the innermost -1 taking the elements the fixed dims leave over
    and every other -1 set to 1."""
    dims = spec.dims
    shape = [1 if d < 0 else d for d in dims]
    fixed = datatypes.element_count(shape)
    variable = [i for i, d in enumerate(dims) if d < 0]
    if variable:
        fill, rest = divmod(count, fixed) if fixed else (0, count)
        shape[variable[-1]] = fill
    else:
        rest = count - fixed
    if rest:  # Triton's words
        raise invalid_arg(f"The schema can not convert input '{spec.name}' to tensor with "
                          f"proper shape")
    return shape


def _parameter(key: str, value, model_name: str):
    if key.startswith("triton_"):
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage "
            "and should not be specified."
        )
    if not isinstance(value, (bool, int, float, str)):
        raise invalid_arg(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
            f"'string' ('{key}' is not an input of model '{model_name}')"
        )
    return value


def _output_value(out: OutputTensor):
    """A scalar for a single-element output, else something orjson writes as a flat array."""
    datatype = out.datatype
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported; output '{out.name}' cannot "
            "be returned by generate"
        )
    values = output_values(out, "replace")
    return json_number(values[0]) if len(values) == 1 else json_numbers(values)
