"""HTTP generate codec: Triton's flat generate JSON <-> inference.py, plus SSE framing.

A generate request has no tensor metadata: each key of the body (and of its "parameters"
object) is an input when the model has an input of that name, else a request parameter.
Datatype and shape therefore come from the model's signature. The response flattens the
outputs and response parameters into one JSON object.

The keys are taken as Triton takes them: in the order the body lists them, a key listed twice
(or at both levels) once per listing, each time with the first value its object gives it. An
input so given twice is refused as Triton refuses it ("input 'X' already exists in request");
a parameter is set again, and the last setting is the one a model reads. "id" is the request
id and, like any key, an input or a parameter too.

BYTES outputs that are not valid UTF-8 are decoded with U+FFFD replacing each bad sequence:
generate has no binary alternative, and a stream of text tokens may split a character
across responses, so a readable string beats failing the whole response.
"""

import json

import orjson

from shmserve.errors import ServerError, invalid_arg
from shmserve.http.codec import (ID_NOT_STRING, json_input_bytes, json_number, json_numbers,
                                 json_object, output_values)
from shmserve.inference import InferRequest, InferResponse, InputTensor, OutputTensor
from shmserve.ipc import datatypes
from shmserve.signature import ModelSignature, TensorSpec

_RESPONSE_KEYS = ("id", "model_name", "model_version")
_NESTED = "parameters"  # the one key whose value holds more keys

# Triton's words (2.51 to 2.73), though Triton answers the first two with status 500: its
# JSON library calls every type mismatch internal.
_NOT_OBJECT = "attempt to get members for non-object"
_NESTED_NOT_OBJECT = (f"Expected JSON object for keyword: '{_NESTED}': attempt to access JSON "
                      "non-object as object")
_NESTED_IS_INPUT = f"Keyword '{_NESTED}' for nested schema also given as input tensor name"
_IN_NESTED = f"Converting keyword: '{_NESTED}': "


def decode_generate_request(
    body: bytes | memoryview, model_name: str, model_version: str, signature: ModelSignature
) -> InferRequest:
    """Parse a generate body. The request asks for every output of the model."""
    doc, repeats = _document(body)
    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise invalid_arg(ID_NOT_STRING)
    request = InferRequest(model_name=model_name, model_version=model_version, id=request_id)
    batched = signature.max_batch_size > 0
    for key in _keys(doc, repeats):
        if key != _NESTED:
            _add(request, key, doc[key], signature, batched)
            continue
        if key in signature.inputs:
            raise invalid_arg(_NESTED_IS_INPUT)
        nested = doc[key]
        if type(nested) is not dict:
            raise invalid_arg(_NESTED_NOT_OBJECT)
        try:
            for inner in _keys(nested, repeats):
                _add(request, inner, nested[inner], signature, batched)
        except ServerError as exc:
            raise ServerError(exc.code, _IN_NESTED + exc.message) from None
    return request


def _document(body) -> tuple[dict, dict | None]:
    """The body's object, each key with the first value given to it, and, when some object
    of it lists a key more than once, its keys as listed, by the id() of that object."""
    doc = json_object(body, _NOT_OBJECT)
    if not _may_repeat_keys(body, doc):
        return doc, None
    repeats = {}

    def first_values(pairs):
        obj = {}
        for key, value in pairs:
            obj.setdefault(key, value)
        if len(obj) != len(pairs):
            # The listing keeps every value alive, so no other object takes this one's id.
            repeats[id(obj)] = [key for key, _ in pairs], pairs
        return obj

    try:
        doc = json.loads(bytes(body).decode(), object_pairs_hook=first_values)
    except RecursionError:  # deeper than this parser goes: nested in a value, which fails
        return doc, None
    return doc, repeats


# Keys looked for one by one in the body at most; past them, the body is parsed again (the
# search is a pass over the body per key).
_KEYS_SEARCHED = 16


def _may_repeat_keys(body, doc: dict) -> bool:
    """False when neither the body's object nor its "parameters" lists a key twice: without
    escapes, each listing of a key k is the text "k" in the body."""
    raw = body if type(body) is bytes else bytes(body)
    if b"\\" in raw:
        return True
    keys = list(doc)
    nested = doc.get(_NESTED)
    if type(nested) is dict:
        keys.extend(nested)
    if len(keys) > _KEYS_SEARCHED:
        return True
    return any(raw.count(b'"%s"' % key.encode()) > 1 for key in keys)


def _keys(obj: dict, repeats: dict | None):
    listed = repeats.get(id(obj)) if repeats else None
    return obj.keys() if listed is None else listed[0]


def _add(request: InferRequest, key: str, value, signature: ModelSignature, batched: bool):
    spec = signature.inputs.get(key)
    if spec is None:
        # Set again if set before: a model reads the last value, as it reads Triton's list of
        # parameters with the name twice (json.loads of '{"p":1,"p":2}').
        request.parameters[key] = _parameter(key, value)
        return
    tensor = input_tensor(spec, value, batched)  # as Triton: the value is read first
    if any(t.name == key for t in request.inputs):
        raise invalid_arg(f"[request id: {request.id or '<id_unknown>'}] input '{key}' already "
                          "exists in request")
    request.inputs.append(tensor)


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


def input_tensor(spec: TensorSpec, value, batched: bool) -> InputTensor:
    """The input `spec` holding a JSON scalar or flat array, shaped by its config dims (and
    a batch of 1 for a model that batches)."""
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


def _parameter(key: str, value):
    if key.startswith("triton_"):
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage "
            "and should not be specified."
        )
    if not isinstance(value, (bool, int, float, str)):  # Triton's words
        raise invalid_arg(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
            "'string'."
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
