"""HTTP infer codec: the v2 JSON body (with Triton's binary tensor extension) <-> inference.py.

Pure translation. The checks here are the ones Triton's HTTP front makes while parsing, with
its message texts; everything that needs the model config is the dataplane's job.
"""

import json
from dataclasses import dataclass, field

import numpy as np
import orjson

from shmserve.errors import internal, invalid_arg
from shmserve.fastpath.prepared_answers import AnswerLayout
from shmserve.fastpath.request_templates import MAX_KEY_BYTES, BoundedCache, RequestTemplate
from shmserve.inference import (
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    RequestedOutput,
)
from shmserve.ipc import datatypes

# Triton's words, for infer and generate (with status 500: its JSON library's type errors).
ID_NOT_STRING = "Unable to parse 'id': attempt to access JSON non-string as string"

_SHM_REGION = "shared_memory_region"
_SHM_INTS = ("shared_memory_byte_size", "shared_memory_offset")

# numpy dtype kinds that `np.array(json_list)` may produce for each fixed-size datatype.
# Stricter than a plain cast: 1.5 is no INT32 and true is no FP32, as in Triton.
_JSON_KINDS = {"BOOL": "b", "FP32": "iuf", "FP64": "iuf"}
_INT_LIMITS = {
    name: np.iinfo(datatypes.numpy_dtype(name))
    for name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
}
_JSON_KINDS.update({name: "iu" for name in _INT_LIMITS})

_BOOL_BYTES = np.dtype(np.uint8)


@dataclass(slots=True)
class OutputFormat:
    """How each output of the response goes back on the wire.

    Outputs the request lists are binary only with their own `binary_data: true`; outputs it
    does not list follow the request's `binary_data_output` (JSON by default). Outputs the
    client placed in its own shared memory go back as metadata only.
    """

    binary_default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)
    shared_memory: set[str] = field(default_factory=set)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)

    def in_shared_memory(self, name: str) -> bool:
        return name in self.shared_memory


def decode_infer_request(
    body: bytes | memoryview,
    header_length: int | None,
    model_name: str,
    model_version: str,
) -> tuple[InferRequest, OutputFormat]:
    """Parse an infer body. `header_length` is the Inference-Header-Content-Length value
    (None: the whole body is JSON; 0, a raw binary request, needs the model and is
    raw_request.py's). Binary inputs are zero-copy slices of `body`."""
    view = memoryview(body).cast("B")
    total = len(view)
    if header_length is None:
        header_length = total
    elif header_length < 0 or header_length > total:
        raise invalid_arg(
            f"inference header size should be in range (0, {total}), got: {header_length}"
        )
    key = None
    if header_length <= MAX_KEY_BYTES:
        key = (model_name, model_version, total, bytes(view[:header_length]))
        known = _TEMPLATES.get(key)
        if known is not None:
            template, spans, fmt = known
            return template.fill([None if span is None else view[span[0]:span[1]]
                                  for span in spans]), fmt
    doc = json_object(view[:header_length])

    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise invalid_arg(ID_NOT_STRING)
    fmt = OutputFormat()
    parameters = _request_parameters(doc.get("parameters"), fmt)
    inputs, spans = _inputs(doc.get("inputs"), view, header_length, model_name)
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        parameters=parameters,
        inputs=inputs,
        outputs=_outputs(doc.get("outputs"), fmt),
    )
    # Inputs given as JSON `data` (in the header) are decoded anew each time.
    if key is not None and False not in spans:
        request.template = RequestTemplate(request)
        _TEMPLATES.put(key, (request.template, spans, fmt))
    return request, fmt


# Requests with the same JSON header, and as many binary bytes after it, are decoded once
# (see fastpath/request_templates.py): the header keys (the template, each input's span of the
# body, the OutputFormat, which is only read and so shared).
_TEMPLATES = BoundedCache()


def json_object(buf, not_object: str = "failed to parse the request JSON buffer: expected a "
                                       "JSON object") -> dict:
    """A request body's JSON object; INVALID_ARG for anything else (`not_object` for JSON
    that is not an object)."""
    try:
        doc = orjson.loads(buf)
    except orjson.JSONDecodeError as e:
        doc = _non_finite_json(buf)
        if doc is None:
            raise invalid_arg(f"failed to parse the request JSON buffer: {e.msg} at {e.pos}") \
                from None
    if type(doc) is not dict:
        raise invalid_arg(not_object)
    return doc


def _non_finite_json(buf):
    """The document, if it is JSON but for NaN, Infinity and -Infinity, which Triton's parser
    accepts and tritonclient writes for such floats (Python's json does); else None."""
    raw = bytes(buf)
    if b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
        return None


def json_numbers(array):
    """output_values' answer as orjson should write it. orjson writes NaN and infinities as
    null; Triton writes NaN, Infinity and -Infinity, which tritonclient reads back as floats."""
    if type(array) is not np.ndarray or array.dtype.kind != "f":
        return array
    if array.dtype == np.float32:
        # Triton writes an FP32 value as the double it is exactly (0.1 as
        # 0.10000000149011612), not as the shortest text that reads back as that float32.
        array = array.astype(np.float64)
    finite = np.isfinite(array)
    if finite.all():
        return array
    tokens = orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    for i in np.flatnonzero(~finite):
        tokens[i] = _non_finite_token(array[i])
    return orjson.Fragment(b"[" + b",".join(tokens) + b"]")


def json_number(value):
    """One element as orjson should write it (see json_numbers)."""
    if isinstance(value, np.floating):
        if not np.isfinite(value):
            return orjson.Fragment(_non_finite_token(value))
        return float(value)  # an FP32 value as the double it is, as json_numbers writes it
    return value


def _non_finite_token(value) -> bytes:
    return b"NaN" if value != value else b"Infinity" if value > 0 else b"-Infinity"


def encode_infer_response(
    response: InferResponse, fmt: OutputFormat
) -> tuple[list[bytes | memoryview], int | None, str]:
    """Returns (body chunks, Inference-Header-Content-Length or None, Content-Type).

    Binary output bytes are returned as their own chunks, uncopied, after the JSON header."""
    chunks: list[bytes | memoryview] = [b""]
    outputs = []
    for out in response.outputs:
        entry = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
        if fmt.in_shared_memory(out.name):
            if out.parameters:
                entry["parameters"] = out.parameters
        elif fmt.is_binary(out.name):
            size = datatypes.byte_length(out.data)
            entry["parameters"] = {**out.parameters, "binary_data_size": size}
            if size:
                chunks.append(out.data)
        else:
            if out.parameters:
                entry["parameters"] = out.parameters
            entry["data"] = _json_data(out)
        outputs.append(entry)

    header = {}
    if response.id:
        header["id"] = response.id
    header["model_name"] = response.model_name
    header["model_version"] = response.model_version
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = outputs
    chunks[0] = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    # As Triton: the header length is only sent when binary bytes actually follow.
    if len(chunks) > 1:
        return chunks, len(chunks[0]), "application/octet-stream"
    return chunks, None, "application/json"


def prepared_answer(head: bytes, chunks: list, response: InferResponse) -> AnswerLayout | None:
    """The layout of the answer just built (`head`, then `chunks`: encode_infer_response's
    JSON header and each output's bytes), for answers that differ from it only in the outputs'
    bytes (a prepared answer, fastpath/prepared_answers.py). None unless its outputs all
    follow the JSON header as binary data of a fixed size, and nothing in it depends on more
    than their names, datatypes and shapes: every other answer puts what the outputs hold
    into the JSON header."""
    outputs = response.outputs
    if response.parameters or len(chunks) != len(outputs) + 1 \
            or any(o.parameters or o.datatype == "BYTES" for o in outputs):
        return None
    first = head + chunks[0]
    expected = [[o.name, o.datatype, list(o.shape), memoryview(chunk).nbytes]
                for o, chunk in zip(outputs, chunks[1:])]
    return AnswerLayout([first, *(b"" for _ in outputs)],
                        len(first) + sum(nbytes for *_, nbytes in expected), expected)


def _request_parameters(params, fmt: OutputFormat) -> dict:
    if params is None:
        return {}
    if type(params) is not dict:
        raise invalid_arg("Unable to parse 'parameters'")
    result = {}
    for key, value in params.items():
        if key == "binary_data_output":
            if type(value) is not bool:
                raise invalid_arg("Unable to parse 'binary_data_output'")
            fmt.binary_default = value
        elif key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        elif isinstance(value, (bool, int, float, str)):
            result[key] = value
        else:
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either "
                "'int', 'bool', or 'string'."
            )
    return result


def _inputs(items, view: memoryview, offset: int, model_name: str) -> tuple[list, list]:
    """(the inputs, where each one's data is: its (start, end) in `view` when binary, None
    when in a shared-memory region, False when given as JSON `data`)."""
    if type(items) is not list:
        raise invalid_arg("Unable to parse 'inputs'")
    total = len(view)
    inputs = []
    spans = []
    for item in items:
        if type(item) is not dict:
            raise invalid_arg("Unable to parse 'inputs'")
        name = item.get("name")
        if type(name) is not str:
            raise invalid_arg("Unable to parse 'name'")
        datatype = item.get("datatype")
        if type(datatype) is not str:
            raise invalid_arg("Unable to parse 'datatype'")
        if datatype not in datatypes.WIRE_TYPES:
            raise invalid_arg(f"invalid datatype '{datatype}' for input '{name}'")
        shape = item.get("shape")
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise invalid_arg("Unable to parse 'shape'")
        params = item.get("parameters")
        if params is None:
            params = {}
        elif type(params) is not dict:
            raise invalid_arg("Unable to parse 'parameters'")

        has_data = "data" in item
        has_binary = "binary_data_size" in params
        has_shm = _SHM_REGION in params
        if has_data + has_binary + has_shm != 1:
            raise invalid_arg(_content_error(has_data, has_binary, has_shm))

        if has_binary:
            size = params.pop("binary_data_size")
            if type(size) is not int or size < 0:
                raise invalid_arg("Unable to parse 'binary_data_size'")
            end = offset + size
            if end > total:
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {end - total} "
                    f"additional bytes for model '{model_name}'"
                )
            data = view[offset:end]
            spans.append((offset, end))
            offset = end
        elif has_shm:
            _check_shm_params(params)
            data = None
            spans.append(None)
        else:
            data = json_input_bytes(name, datatype, shape, item["data"])
            spans.append(False)
        inputs.append(InputTensor(name, datatype, shape, data, params))

    if offset != total:
        raise invalid_arg(f"unexpected additional input data for model '{model_name}'")
    return inputs, spans


def _content_error(has_data: bool, has_binary: bool, has_shm: bool) -> str:
    message = (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But"
    )
    if not (has_data or has_binary or has_shm):
        return message + " no field is set"
    message += " set"
    if has_data:
        message += " 'data'"
    if has_binary:
        message += " 'binary_data_size'"
    if has_shm:
        message += " 'shared_memory_region'"
    return message


def _check_shm_params(params: dict) -> None:
    if type(params[_SHM_REGION]) is not str:
        raise invalid_arg(f"Unable to parse '{_SHM_REGION}'")
    for key in _SHM_INTS:
        value = params.get(key, 0)
        if type(value) is not int or value < 0:
            raise invalid_arg(f"Unable to parse '{key}'")


def json_input_bytes(name: str, datatype: str, shape: list[int], data) -> memoryview | bytes:
    """Wire bytes of a JSON `data` array (flat or nested) for a tensor of `shape`;
    INVALID_ARG when the values do not fit the datatype or the shape."""
    if datatype in ("FP16", "BF16") and (type(data) is not list or _holds(data, _ELEMENT)):
        # As Triton: an empty array has no value to refuse.
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    if type(data) is not list:
        raise invalid_arg(f"Unable to parse 'data' of input '{name}': expected a JSON array")
    expected = datatypes.element_count(shape)

    if datatype == "BYTES":  # its depth is checked everywhere, while it is flattened
        elements: list[str] = []
        _flatten_strings(data, elements, name)
        _check_count(name, shape, expected, len(elements))
        return datatypes.serialize_bytes(elements)

    # Triton's check of every element's depth, along the first elements: arrays nested
    # unevenly elsewhere are refused by numpy.
    depth, first = 0, data
    while type(first) is list:
        depth += 1
        if depth >= MAX_JSON_DEPTH:
            raise invalid_arg(f"Unable to parse 'data': {_TOO_DEEP}")
        first = first[0] if first else None
    try:
        array = np.array(data)
    except ValueError:
        raise invalid_arg(
            f"Unable to parse 'data' of input '{name}': nested arrays of unequal length "
            "or nested too deep"
        ) from None
    _check_count(name, shape, expected, array.size)
    if not array.size:
        return b""
    kind = array.dtype.kind
    limits = _INT_LIMITS.get(datatype)
    if kind != "b" and _holds(data, bool):
        raise _bad_values(name, datatype)
    if limits is not None and kind in "fO":
        # Triton takes only JSON integers for an integer type: 1.0 is refused like 1.5.
        if _holds(data, float):
            raise _bad_values(name, datatype)
        array = _exact_integers(name, datatype, data, array)
    elif kind not in _JSON_KINDS[datatype]:
        raise _bad_values(name, datatype)
    elif limits is not None and (array.min() < limits.min or array.max() > limits.max):
        raise _out_of_range(name, datatype)
    with np.errstate(over="ignore"):  # beyond FP32's range is an infinity, as in Triton
        array = array.astype(datatypes.numpy_dtype(datatype), copy=False).reshape(-1)
    return memoryview(array.view(np.uint8))


_ELEMENT = object()  # _holds: any element that is not a list
# Arrays in `data` nested this deep are refused, as by Triton since 2.58 (its elements are then
# this deep: a flat array's are at depth 1).
MAX_JSON_DEPTH = 100
_TOO_DEEP = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"


def _holds(data: list, kind) -> bool:
    """Whether a (nested) list holds an element of type `kind` (or any element, for
    _ELEMENT). numpy reads true and false as 1 and 0 among numbers, and 1.0 as 1 for an
    integer type: Triton refuses both."""
    pending = [data]
    while pending:
        items = pending.pop()
        types = set(map(type, items))
        if kind in types or (kind is _ELEMENT and types - {list}):
            return True
        if list in types:
            pending.extend(item for item in items if type(item) is list)
    return False


def _exact_integers(name: str, datatype: str, data: list, inferred: np.ndarray) -> np.ndarray:
    """numpy infers float64 or object for integer lists that leave the int64 range (large
    UINT64 values); convert those exactly, and still refuse true non-integers."""
    try:
        exact = np.array(data, dtype=datatypes.numpy_dtype(datatype))
    except OverflowError:
        raise _out_of_range(name, datatype) from None
    except (TypeError, ValueError):
        raise _bad_values(name, datatype) from None
    if inferred.dtype.kind == "f" and not np.array_equal(exact, inferred):
        raise _bad_values(name, datatype)
    return exact


def _bad_values(name: str, datatype: str):
    return invalid_arg(f"Unable to parse 'data' of input '{name}': expected {datatype} values")


def _out_of_range(name: str, datatype: str):
    return invalid_arg(f"Unable to parse 'data' of input '{name}': value out of range for {datatype}")


def _flatten_strings(data: list, into: list[str], name: str) -> None:
    # Without recursion: JSON may nest arrays deeper than Python's recursion limit.
    pending = [iter(data)]
    while pending:
        for element in pending[-1]:
            if type(element) is str:
                into.append(element)
            elif type(element) is list:
                if len(pending) + 1 >= MAX_JSON_DEPTH:
                    raise invalid_arg(_TOO_DEEP)
                pending.append(iter(element))
                break
            else:
                raise invalid_arg(
                    f"Unable to parse 'data' of input '{name}': expected BYTES as JSON strings")
        else:
            pending.pop()


def _check_count(name: str, shape: list[int], expected: int, got: int) -> None:
    if got != expected:
        raise invalid_arg(
            f"unexpected number of elements for input '{name}': 'data' has {got}, "
            f"shape {shape} needs {expected}"
        )


def _outputs(items, fmt: OutputFormat) -> list[RequestedOutput]:
    if items is None:
        return []
    if type(items) is not list:
        raise invalid_arg("Unable to parse 'outputs'")
    outputs = []
    for item in items:
        if type(item) is not dict:
            raise invalid_arg("Unable to parse 'outputs'")
        name = item.get("name")
        if type(name) is not str:
            raise invalid_arg("Unable to parse 'name'")
        params = item.get("parameters")
        if params is None:
            params = {}
        elif type(params) is not dict:
            raise invalid_arg("Unable to parse 'parameters'")

        binary = params.pop("binary_data", None)
        if binary is not None and type(binary) is not bool:
            raise invalid_arg("Unable to parse 'binary_data'")
        classification = params.get("classification")
        if classification is not None and (type(classification) is not int or classification < 0):
            raise invalid_arg("Unable to set 'classification'")
        if _SHM_REGION in params:
            if classification is not None:
                raise invalid_arg(
                    "Output can't set both 'shared_memory_region' and 'classification'"
                )
            if binary:
                raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
            _check_shm_params(params)
            fmt.shared_memory.add(name)
        else:
            # As Triton: a listed output is JSON unless it asks for binary itself;
            # binary_data_output only covers outputs the request does not list. An output
            # listed twice takes its first listing's format.
            fmt.binary.setdefault(name, bool(binary))
        outputs.append(RequestedOutput(name, params))
    return outputs


def _json_data(out: OutputTensor):
    """The output's elements as something orjson writes as a flat JSON array."""
    datatype = out.datatype
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported. Please use the binary data "
            "format for output"
        )
    if datatype not in datatypes.WIRE_TYPES:
        raise invalid_arg("Invalid data type for output tensor")
    try:
        return json_numbers(output_values(out, "strict"))
    except UnicodeDecodeError:
        # Triton writes such bytes into the JSON unchecked, producing a body that is not
        # valid UTF-8 and that tritonclient fails to parse. A clear error is kinder.
        raise invalid_arg(
            f"output '{out.name}' holds BYTES that are not valid UTF-8 and cannot be "
            "returned as JSON; request it with binary_data=true"
        ) from None


def output_values(out: OutputTensor, utf8_errors: str):
    """An output's elements, flat, as JSON shows them: BYTES decoded to str (UTF-8, with
    `utf8_errors` as str.decode takes it), BOOL as bools, numbers as a numpy array."""
    datatype = out.datatype
    count = datatypes.element_count(out.shape)
    mismatch = f"output tensor shape does not match size of output for '{out.name}'"
    if datatype == "BYTES":
        try:
            elements = datatypes.deserialize_bytes(out.data, count)
        except ValueError:
            raise internal(mismatch) from None
        return [element.decode(errors=utf8_errors) for element in elements]
    dtype = _BOOL_BYTES if datatype == "BOOL" else datatypes.numpy_dtype(datatype)
    if datatypes.byte_length(out.data) != count * dtype.itemsize:
        raise internal(mismatch)
    array = np.frombuffer(out.data, dtype)
    return array != 0 if datatype == "BOOL" else array
