"""gRPC infer codec: ModelInferRequest / ModelInferResponse <-> inference.py.

Pure translation. The checks here are the ones Triton's gRPC front makes while reading a
request, with its message texts; everything that needs the model config is the dataplane's.
"""

import numpy as np
from google.protobuf.message import DecodeError

from shmserve import proto
from shmserve.errors import internal, invalid_arg
from shmserve.fastpath.prepared_answers import AnswerLayout
from shmserve.fastpath.request_templates import MAX_KEY_BYTES, BoundedCache, RequestTemplate
from shmserve.inference import InferRequest, InferResponse, InputTensor, RequestedOutput
from shmserve.ipc import datatypes

# The one `triton_` request parameter a client may send (ModelStreamInfer's empty final response).
_ALLOWED_TRITON_PARAMS = ("triton_enable_empty_final_response",)
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

_SHM_REGION = "shared_memory_region"
_SHM_INTS = ("shared_memory_byte_size", "shared_memory_offset")

# datatype -> the InferTensorContents field that may carry it. FP16 and BF16 have none: they
# must come as raw_input_contents.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# contents field -> (datatype named in errors, numpy dtype of its protobuf element type)
_FIELD_TYPES = {
    "bool_contents": ("BOOL", np.dtype(np.bool_)),
    "int_contents": ("INT32", np.dtype(np.int32)),
    "int64_contents": ("INT64", np.dtype(np.int64)),
    "uint_contents": ("UINT32", np.dtype(np.uint32)),
    "uint64_contents": ("UINT64", np.dtype(np.uint64)),
    "fp32_contents": ("FP32", np.dtype(np.float32)),
    "fp64_contents": ("FP64", np.dtype(np.float64)),
    "bytes_contents": ("BYTES", None),
}


def parameters_from_proto(params) -> dict:
    """map<string, InferParameter> -> {key: bool | int | float | str}."""
    if not params:
        return {}
    result = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is None:
            raise invalid_arg(f"invalid value type for '{key}' parameter, no value is set.")
        result[key] = getattr(value, choice)
    return result


# The kinds Triton takes for a request's parameters: its own keys each have theirs (priority's
# and the sequence flags' are checked where they are used), any other key all but uint64.
_REQUEST_PARAMETER_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "timeout": ("int64_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}


def _check_request_parameter_kinds(params) -> None:
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        kinds = _REQUEST_PARAMETER_KINDS.get(key)
        if kinds is not None and choice not in kinds:
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected "
                              f"{' or '.join(kinds)}.")
        if kinds is None and choice == "uint64_param" and key != "priority":
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected "
                              f"int64_param, bool_param, or string_param.")


def parameters_to_proto(params: dict, target) -> None:
    """{key: bool | int | float | str} -> map<string, InferParameter> `target`. Integers
    beyond int64 (but within uint64) become uint64_param."""
    for key, value in params.items():
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            if _INT64_MIN <= value <= _INT64_MAX:
                slot.int64_param = value
            elif _INT64_MAX < value <= _UINT64_MAX:
                slot.uint64_param = value
            else:
                raise internal(f"parameter '{key}' is out of the 64-bit integer range")
        elif isinstance(value, float):
            slot.double_param = value
        elif isinstance(value, str):
            slot.string_param = value
        else:
            raise internal(
                f"parameter '{key}' has unsupported type {type(value).__name__}; "
                "expected bool, int, float or str"
            )


# raw_input_contents is field 7 of ModelInferRequest, length-delimited.
_RAW_INPUT_FIELD = 7
# Below this a request is parsed by protobuf whole: splitting it in Python costs more than the
# copies it saves.
_SPLIT_FROM_BYTES = 64 * 1024
# raw_input_contents' key byte (field 7, length-delimited).
_RAW_INPUT_KEY = _RAW_INPUT_FIELD << 3 | 2
# A message is split in Python only while it has at most this many top-level fields (a
# request has one per input, output, parameter and raw input, and a few more); one with more
# is parsed by protobuf whole, so that no message costs a Python step (and a view) for every
# few bytes.
_MAX_SPLIT_FIELDS = 1024


# Requests whose fields before raw_input_contents are the same bytes are decoded once (see
# fastpath/request_templates.py): those bytes key (the template, which inputs take a raw
# entry).
_TEMPLATES = BoundedCache()


def read_model_infer_request(wire: bytes) -> InferRequest:
    """The InferRequest in a ModelInferRequest's wire bytes, its raw inputs as views of
    `wire`."""
    split = _split_trailing_raw(wire)
    if split is None or split[0] > MAX_KEY_BYTES:
        return decode_model_infer_request(*parse_model_infer_request(wire))
    cut, raw = split
    head = bytes(wire[:cut])  # a dict key, even when `wire` is a view of the read buffer
    known = _TEMPLATES.get(head)
    if known is not None:
        template, takes_raw = known
        if takes_raw is None:  # every input takes one, the usual case
            if len(raw) == len(template.inputs):
                return template.fill(raw)
        elif len(raw) == sum(takes_raw):
            entries = iter(raw)
            return template.fill([next(entries) if t else None for t in takes_raw])
    request = decode_model_infer_request(_parse_request(head), raw)
    # An input without data is in a shared-memory region. Inputs given as `contents` (in the
    # head, not raw) are decoded anew each time.
    takes_raw = [t.data is not None for t in request.inputs]
    if sum(takes_raw) == len(raw):
        request.template = RequestTemplate(request)
        _TEMPLATES.put(head, (request.template, None if all(takes_raw) else takes_raw))
    return request


def _split_trailing_raw(wire: bytes):
    """(where raw_input_contents begin, their views) when the message is made of one-byte-key
    length-delimited fields, raw_input_contents last: what protobuf serializers write, as they
    write fields in number order. None for any other layout (protobuf then parses it)."""
    pos = 0
    end = len(wire)
    cut = None
    raw = []
    view = None
    try:
        while pos < end:
            key = wire[pos]
            if key & 7 != 2 or key > 0x7F or key < 8:
                return None
            if cut is None and pos > MAX_KEY_BYTES or len(raw) > _MAX_SPLIT_FIELDS:
                return None  # not a template's head, or not a request of that layout
            length = wire[pos + 1]
            if length < 0x80:
                start = pos + 2
            else:
                length, start = _read_varint(wire, pos + 1)
            stop = start + length
            if stop > end:
                return None
            if key == _RAW_INPUT_KEY:
                if cut is None:
                    cut = pos
                    view = memoryview(wire)
                raw.append(view[start:stop])
            elif cut is not None:
                return None
            pos = stop
    except (IndexError, ValueError):
        return None
    return (end if cut is None else cut), raw


def parse_model_infer_request(wire: bytes):
    """(the ModelInferRequest, its raw_input_contents as views of `wire` or None). Protobuf
    would copy each raw input out of the message; for large inputs the views spare that.
    Field 0 and wire types 6 and 7 are refused where they are met; a message with groups or
    more than _MAX_SPLIT_FIELDS fields is left to protobuf whole."""
    if len(wire) < _SPLIT_FROM_BYTES:
        return _parse_request(wire), None
    view = memoryview(wire)
    rest = []  # the spans between raw inputs
    raw = []
    pos = 0
    span = 0  # where the current span of other fields began
    end = len(wire)
    fields = 0
    try:
        while pos < end:
            fields += 1
            if fields > _MAX_SPLIT_FIELDS:
                return _parse_request(wire), None
            start = pos
            key, value, pos = _next_field(wire, pos)
            if pos == _GROUP:  # protobuf knows where it ends, and what may be inside it
                return _parse_request(wire), None
            if pos > end:
                raise ValueError("truncated message")
            if key == _RAW_INPUT_KEY:
                if span < start:
                    rest.append(view[span:start])
                raw.append(view[value:pos])
                span = pos
    except (ValueError, IndexError) as exc:
        raise invalid_arg(f"failed to parse the ModelInferRequest: {exc}") from None
    if span < end:
        rest.append(view[span:end])
    return _parse_request(b"".join(rest)), raw


def check_partial_request(head: bytes, length: int) -> str | None:
    """What is wrong with a ModelInferRequest of `length` bytes that begins with `head`, as
    far as its top-level fields show (the transport asks before taking more of a long
    message); None when nothing is, yet."""
    pos = 0
    end = len(head)
    try:
        for _ in range(_MAX_SPLIT_FIELDS):
            if pos >= end:
                return None
            _, _, pos = _next_field(head, pos)
            if pos == _GROUP:
                return None  # for protobuf to judge once the message is whole
            if pos > length:
                return "failed to parse the ModelInferRequest: a field runs past its end"
    except IndexError:
        return None  # a key or length cut where the head ends
    except ValueError as exc:
        return f"failed to parse the ModelInferRequest: {exc}"
    return None


# _next_field's end for a group (wire types 3 and 4), whose end only a parse finds.
_GROUP = -1


def _next_field(wire, pos: int) -> tuple[int, int, int]:
    """(key, where its value begins, where it ends) of the field at `pos`; ValueError for
    field number 0 and wire types 6 and 7, IndexError for a key or length cut short."""
    key, pos = _read_varint(wire, pos)
    if key < 8:
        raise ValueError("field number 0")
    wire_type = key & 7
    if wire_type == 2:
        length, pos = _read_varint(wire, pos)
        return key, pos, pos + length
    if wire_type == 0:
        return key, pos, _read_varint(wire, pos)[1]
    if wire_type in (1, 5):
        return key, pos, pos + (8 if wire_type == 1 else 4)
    if wire_type in (3, 4):
        return key, pos, _GROUP
    raise ValueError(f"unexpected wire type {wire_type}")


def _parse_request(wire: bytes):
    try:
        return proto.ModelInferRequest.FromString(wire)
    except DecodeError as exc:
        raise invalid_arg(f"failed to parse the ModelInferRequest: {exc}") from None


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def decode_model_infer_request(msg, raw=None) -> InferRequest:
    """`raw`: the request's raw_input_contents when parse_model_infer_request split them off."""
    params = parameters_from_proto(msg.parameters)
    if params:
        _check_request_parameter_kinds(msg.parameters)
    for key in params:
        if key.startswith("triton_") and key not in _ALLOWED_TRITON_PARAMS:
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
                "the following keys starting with 'triton_' are allowed: "
                + " ".join(_ALLOWED_TRITON_PARAMS)
            )

    model = msg.model_name
    if raw is None:
        raw = msg.raw_input_contents
    raw_count = len(raw)
    raw_used = 0
    inputs = []
    for tensor in msg.inputs:
        name = tensor.name
        datatype = tensor.datatype
        if datatype not in datatypes.WIRE_TYPES:
            raise invalid_arg(f"invalid datatype '{datatype}' for input '{name}'")
        shape = tensor.shape[:]
        if shape and min(shape) < 0:
            raise invalid_arg(f"invalid shape {shape} for input '{name}'")
        tensor_params = parameters_from_proto(tensor.parameters)
        has_contents = tensor.HasField("contents")
        if has_contents and _SHM_REGION in tensor_params:
            raise invalid_arg(
                "unexpected 'content' provided when using shared memory for input tensor "
                f"'{name}' for model '{model}'"
            )
        if tensor_params and _in_shared_memory(tensor.parameters, name):
            data = None
        elif has_contents:
            if raw_count:
                raise invalid_arg(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model}'"
                )
            data = _typed_contents_bytes(tensor.contents, name, datatype, model)
        elif raw_used < raw_count:
            data = raw[raw_used]
            raw_used += 1
        else:
            raise invalid_arg(
                f"unable to find data for input tensor '{name}' for model '{model}' in request."
            )
        inputs.append(InputTensor(name, datatype, shape, data, tensor_params))
    if raw_used != raw_count:
        raise invalid_arg(
            f"expected {raw_used} raw_input_contents entries (one per input not in shared "
            f"memory) but got {raw_count} for model '{model}'"
        )

    outputs = []
    for requested in msg.outputs:
        output_params = parameters_from_proto(requested.parameters)
        if output_params:
            _in_shared_memory(requested.parameters, requested.name)
        outputs.append(RequestedOutput(requested.name, output_params))

    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id,
        parameters=params,
        inputs=inputs,
        outputs=outputs,
    )


# raw_output_contents is field 6 of ModelInferResponse, length-delimited (wire type 2).
_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])


def serialize_model_infer_response(resp: InferResponse) -> bytes:
    """The wire bytes of the ModelInferResponse for `resp`, with one raw_output_contents
    entry per output, in output order, always (tritonclient finds an output's bytes by its
    position). Each output's bytes are copied once, straight from where they are: protobuf
    would copy a large output three times (into bytes, into the message, into the serialized
    buffer), page-faulting fresh memory each time. Protobuf parsers take a repeated field's
    elements appended after the other fields."""
    pieces, _ = _response_pieces(resp)
    return b"".join(pieces)


def prepared_message(resp: InferResponse) -> AnswerLayout | None:
    """The wire bytes of the ModelInferResponse for `resp` as pieces around its outputs'
    bytes, for responses that differ from it only in those bytes (a prepared answer's message,
    fastpath/prepared_answers.py; the HTTP/2 frames around it depend on the stream), as
    serialize_model_infer_response writes it. None when the message says more than the
    outputs' names, datatypes and shapes (parameters) or their sizes vary (BYTES)."""
    outputs = resp.outputs
    if resp.parameters or any(out.parameters or out.datatype == "BYTES" for out in outputs):
        return None
    pieces = [_response_head_bytes(resp)]
    size = len(pieces[0])
    expected = []
    for out in outputs:
        nbytes = memoryview(out.data).nbytes
        tag = _RAW_OUTPUT_TAG + _varint(nbytes)
        pieces[-1] += tag
        pieces.append(b"")
        size += len(tag) + nbytes
        expected.append([out.name, out.datatype, list(out.shape), nbytes])
    return AnswerLayout(pieces, size, expected)


# ModelStreamInferResponse's infer_response is its field 2, length-delimited.
_STREAM_RESPONSE_TAG = bytes([2 << 3 | 2])


def _final_flag(final: bool) -> bytes:
    msg = proto.ModelInferResponse()
    msg.parameters["triton_final_response"].bool_param = final
    return msg.SerializeToString()


# A map entry appended to a message's other entries joins them (a later key would win).
_FINAL_FLAG = {final: _final_flag(final) for final in (False, True)}


def serialize_stream_infer_response(resp: InferResponse, final: bool) -> bytes:
    """The wire bytes of a ModelStreamInferResponse holding `resp`, with its
    triton_final_response parameter, built as serialize_model_infer_response builds its
    message."""
    pieces, size = _response_pieces(resp)
    flag = _FINAL_FLAG[final]
    pieces.append(flag)
    pieces.insert(0, _STREAM_RESPONSE_TAG + _varint(size + len(flag)))
    return b"".join(pieces)


def _response_pieces(resp: InferResponse) -> tuple[list, int]:
    """The pieces of a serialized ModelInferResponse, and their total size."""
    head = _response_head_bytes(resp)
    pieces = [head]
    size = len(head)
    for out in resp.outputs:
        data = out.data
        nbytes = data.nbytes if type(data) is memoryview else len(data)
        tag = _RAW_OUTPUT_TAG + _varint(nbytes)
        pieces.append(tag)
        pieces.append(data)
        size += len(tag) + nbytes
    return pieces, size


# The serialized fields other than raw_output_contents, by model, version, id and outputs'
# names, datatypes and shapes: the same for every response to a repeated request.
_HEADS = BoundedCache()


def _response_head_bytes(resp: InferResponse) -> bytes:
    outputs = resp.outputs
    if resp.parameters or any(out.parameters for out in outputs):
        return _response_head(resp).SerializeToString()
    key = (resp.model_name, resp.model_version, resp.id,
           *[(out.name, out.datatype, *out.shape) for out in outputs])
    head = _HEADS.get(key)
    if head is None:
        head = _response_head(resp).SerializeToString()
        _HEADS.put(key, head)
    return head


def _response_head(resp: InferResponse):
    msg = proto.ModelInferResponse()
    msg.model_name = resp.model_name
    msg.model_version = resp.model_version
    msg.id = resp.id
    if resp.parameters:
        parameters_to_proto(resp.parameters, msg.parameters)
    for out in resp.outputs:
        tensor = msg.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        if out.parameters:
            parameters_to_proto(out.parameters, tensor.parameters)
    return msg


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _in_shared_memory(params, tensor: str) -> bool:
    """Whether a tensor's parameters (the proto map) place it in a shared-memory region, with
    Triton's checks of how they do it (bounds are the region's business)."""
    in_region = _SHM_REGION in params
    if in_region and params[_SHM_REGION].WhichOneof("parameter_choice") != "string_param":
        raise invalid_arg(f"invalid value type for '{_SHM_REGION}' parameter for tensor "
                          f"'{tensor}', expected string_param.")
    for key in _SHM_INTS:
        if key not in params:
            continue
        if not in_region:
            raise invalid_arg(f"'{key}' can not be specified without '{_SHM_REGION}' parameter "
                              f"for tensor '{tensor}'")
        if params[key].WhichOneof("parameter_choice") != "int64_param":
            raise invalid_arg(f"invalid value type for '{key}' parameter for tensor '{tensor}', "
                              "expected int64_param.")
    if in_region and _SHM_INTS[0] not in params:
        raise invalid_arg(f"'{_SHM_INTS[0]}' must be specified along with '{_SHM_REGION}' "
                          f"parameter for tensor '{tensor}'")
    return in_region


def _typed_contents_bytes(contents, name: str, datatype: str, model: str) -> bytes | memoryview:
    filled = [field.name for field, _ in contents.ListFields()]
    if not filled:
        return b""
    if len(filled) > 1:
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', "
            "binary data was already supplied."
        )
    field = filled[0]
    field_type, field_dtype = _FIELD_TYPES[field]
    if _CONTENTS_FIELD.get(datatype) != field:
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' "
            f"of type '{field_type}', expected datatype '{datatype}'"
        )
    values = getattr(contents, field)
    if datatype == "BYTES":
        return datatypes.serialize_bytes(values)
    # INT8/INT16 (UINT8/UINT16) keep the low bytes of each 32-bit element, as Triton does.
    array = np.array(values, dtype=field_dtype).astype(datatypes.numpy_dtype(datatype), copy=False)
    return memoryview(array.view(np.uint8))
