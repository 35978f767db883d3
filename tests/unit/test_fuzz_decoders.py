"""Generated bad input for every decoder of client input: the HTTP infer body (JSON and the
binary extension), the gRPC ModelInferRequest, config.pbtxt and JSON configs, the generate
mapping, shared-memory registration and references, and the dataplane's validation.

The property everywhere: a correct result or a ServerError with a message and a client-facing
code, never another exception; and memory in proportion to the input, never to a size the
input claims. perf/fuzz_decoders.py runs the same properties much longer.
"""

import contextlib
import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import orjson
import posix_ipc
import pytest
from google.protobuf import json_format, text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmserve import proto
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import parse_config_json, parse_config_text
from shmserve.admission import prepare
from shmserve.fastpath.checked_templates import CheckedTemplate
from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.errors import Code, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager, decode_raw_handle
from shmserve.grpc import codec as grpc_codec
from shmserve.http import codec as http_codec
from shmserve.http import generate
from shmserve.http.app import _trace_changes
from shmserve.http.codec import OutputFormat, decode_infer_request, encode_infer_response
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import datatypes
from shmserve.observability.tracing import SETTING_NAMES, TraceSettings, Tracer, parse_changes
from shmserve.signature import ModelSignature
from tests.unit.bounds import peak_allocation, run_bounded

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT_CODES = {Code.INVALID_ARG, Code.NOT_FOUND, Code.UNAVAILABLE, Code.UNSUPPORTED,
                Code.ALREADY_EXISTS}
# A claim the decoders must check before acting on it: 100 GB.
HUGE = 100 * 10**9
# What a decoder may allocate beyond a multiple of its input (Python objects, numpy arrays).
ALLOCATION_SLACK = 1 << 20

# perf/fuzz_decoders.py sets the environment variable to run the same properties longer.
FUZZ = settings(max_examples=int(os.environ.get("SHMSERVE_FUZZ_EXAMPLES", 150)), deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Figures for perf/fuzz_decoders.py: inputs each decoder was given, and how many it refused.
TRIED: dict[str, int] = {}
REFUSED: dict[str, int] = {}


def outcome(label: str, fn, *args, codes=CLIENT_CODES):
    """fn(*args), or None when it refused the input the way a client may be told. Counted
    under `label` unless that is None (a second look at an input already counted)."""
    if label:
        TRIED[label] = TRIED.get(label, 0) + 1
    try:
        return fn(*args)
    except ServerError as exc:
        if label:
            REFUSED[label] = REFUSED.get(label, 0) + 1
        assert exc.message.strip(), f"empty message from {fn.__name__}"
        assert exc.code in codes, f"{fn.__name__}: {exc!r}"
        return None


# ---------------------------------------------------------------- strategies

SIZES = st.one_of(st.integers(-3, 64), st.sampled_from([HUGE, 2**31, 2**32 + 1, 2**63 - 1,
                                                        -(2**63)]))
DATATYPES = st.one_of(st.sampled_from(sorted(datatypes.WIRE_TYPES)),
                      st.sampled_from(["", "FP8", "bytes", "INT128", "STRING"]))
NAMES = st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0", "x", "", "triton_x"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
SHAPES = st.one_of(st.lists(SIZES, max_size=4), JSON)


def _json_data(draw, shape):
    """Data that may or may not fit the shape: numbers, strings, bools, nesting, junk."""
    count = datatypes.element_count(shape) if isinstance(shape, list) and all(
        type(d) is int and 0 <= d <= 64 for d in shape) else 2
    element = draw(st.one_of(st.integers(-300, 300), st.floats(allow_nan=False,
                                                               allow_infinity=False),
                             st.booleans(), st.text(max_size=4), st.integers(2**62, 2**64 - 1)))
    flat = [element] * min(count + draw(st.integers(-1, 1)), 64)
    return draw(st.one_of(st.just(flat), st.just([flat]), JSON))


@st.composite
def http_inputs(draw):
    item = {}
    if draw(st.booleans()):
        item["name"] = draw(st.one_of(NAMES, JSON))
    if draw(st.integers(0, 9)):
        item["datatype"] = draw(DATATYPES)
    shape = draw(SHAPES)
    if draw(st.integers(0, 9)):
        item["shape"] = shape
    params = {}
    where = draw(st.sampled_from(["data", "binary", "shm", "both", "none"]))
    if where in ("data", "both"):
        item["data"] = _json_data(draw, shape)
    if where in ("binary", "both"):
        params["binary_data_size"] = draw(st.one_of(SIZES, JSON))
    if where == "shm":
        params["shared_memory_region"] = draw(st.one_of(st.sampled_from(["fuzz", "nope"]), JSON))
        for key in ("shared_memory_offset", "shared_memory_byte_size"):
            if draw(st.booleans()):
                params[key] = draw(st.one_of(SIZES, JSON))
    if params or draw(st.booleans()):
        item["parameters"] = params if draw(st.integers(0, 9)) else draw(JSON)
    return item


@st.composite
def http_bodies(draw):
    """(body, Inference-Header-Content-Length or None)."""
    doc = {}
    if draw(st.booleans()):
        doc["id"] = draw(st.one_of(st.text(max_size=6), JSON))
    if draw(st.integers(0, 9)):
        doc["inputs"] = draw(st.lists(http_inputs(), max_size=3)) if draw(
            st.integers(0, 9)) else draw(JSON)
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": NAMES}, optional={
            "parameters": st.one_of(JSON, st.fixed_dictionaries({}, optional={
                "binary_data": st.one_of(st.booleans(), JSON),
                "classification": st.one_of(SIZES, JSON),
                "shared_memory_region": st.sampled_from(["fuzz", "nope"]),
                "shared_memory_byte_size": SIZES}))}), max_size=3))
    if draw(st.booleans()):
        doc["parameters"] = draw(st.one_of(JSON, st.dictionaries(
            st.sampled_from(["binary_data_output", "triton_x", "sequence_id", "priority",
                             "timeout", "p"]), JSON, max_size=3)))
    head = orjson.dumps(doc)
    if draw(st.integers(0, 9)) == 0:
        head = _mutate(draw, head)
    tail = draw(st.binary(max_size=64))
    header = draw(st.one_of(st.none(), st.just(len(head)), st.integers(-5, len(head) + 80),
                            st.just(HUGE)))
    return head + tail, header


def _mutate(draw, data: bytes) -> bytes:
    """A few byte flips, cuts and insertions."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        op = draw(st.integers(0, 2))
        if op == 0:
            out[at] = draw(st.integers(0, 255))
        elif op == 1:
            del out[at:at + draw(st.integers(1, 8))]
        else:
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(out)


def _parameters(draw, target) -> None:
    for key in draw(st.lists(st.sampled_from(
            ["shared_memory_region", "shared_memory_offset", "shared_memory_byte_size",
             "sequence_id", "triton_x", "triton_enable_empty_final_response", "p"]),
            max_size=3, unique=True)):
        choice = draw(st.sampled_from(["bool_param", "int64_param", "string_param",
                                       "double_param", "uint64_param", None]))
        slot = target[key]
        if choice is None:
            continue  # set with no value
        value = {"bool_param": st.booleans(), "int64_param": st.integers(-(2**63), 2**63 - 1),
                 "uint64_param": st.integers(0, 2**64 - 1), "string_param": st.sampled_from(
                     ["fuzz", "nope", ""]), "double_param": st.floats()}[choice]
        setattr(slot, choice, draw(value))


_CONTENTS = {"bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
             "int64_contents": st.integers(-(2**63), 2**63 - 1),
             "uint_contents": st.integers(0, 2**32 - 1),
             "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32),
             "fp64_contents": st.floats(), "bytes_contents": st.binary(max_size=6)}


@st.composite
def grpc_messages(draw):
    msg = proto.ModelInferRequest(model_name=draw(st.text(max_size=4)), id=draw(st.text(
        max_size=4)))
    _parameters(draw, msg.parameters)
    for _ in range(draw(st.integers(0, 3))):
        tensor = msg.inputs.add(name=draw(NAMES), datatype=draw(DATATYPES),
                                shape=draw(st.lists(st.one_of(
                                    st.integers(-2, 16), st.sampled_from(
                                        [HUGE, 2**63 - 1, -(2**63)])), max_size=4)))
        _parameters(draw, tensor.parameters)
        for name in draw(st.lists(st.sampled_from(sorted(_CONTENTS)), max_size=2, unique=True)):
            getattr(tensor.contents, name).extend(draw(st.lists(_CONTENTS[name], max_size=8)))
    for _ in range(draw(st.integers(0, 2))):
        _parameters(draw, msg.outputs.add(name=draw(NAMES)).parameters)
    msg.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40), max_size=4)))
    return msg


# ---------------------------------------------------------------- the models requests meet

CONFIGS = {
    "batching": """name: "batching" backend: "python" max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
                { name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] optional: true },
                { name: "x" data_type: TYPE_INT8 dims: [ 2, -1 ] reshape: { shape: [ 2, 1, -1 ] }
                  optional: true } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]""",
    "plain": """name: "plain" backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_BOOL dims: [ 3 ] },
                { name: "INPUT1" data_type: TYPE_UINT64 dims: [ -1, 2 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]""",
}


def _model(name: str):
    config = normalize_config(parse_config_text(CONFIGS[name]), name, 0)
    return SimpleNamespace(name=name, signature=ModelSignature.from_config(config))


MODELS = {name: _model(name) for name in CONFIGS}
REGION_BYTES = 256


@contextlib.contextmanager
def client_region():
    """A SharedMemoryManager with region "fuzz" over a client object of REGION_BYTES; the
    object's name is in the manager's `key`."""
    key = f"/fuzz_decoders_{os.getpid()}"
    shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=REGION_BYTES)
    shm.close_fd()
    try:
        manager = SharedMemoryManager()
        manager.register_system("fuzz", key, 0, REGION_BYTES)
        manager.key = key
        yield manager
    finally:
        posix_ipc.unlink_shared_memory(key)


@pytest.fixture(scope="module")
def regions():
    with client_region() as manager:
        yield manager


def check_prepared(request, model, manager):
    """What the dataplane admits is what the model's signature promises: the WorkRequest,
    or None for a refused request."""
    prepared = outcome("dataplane", prepare, request, model, manager)
    if prepared is None:
        return None
    work, batch_size = prepared
    sig = model.signature
    assert 1 <= batch_size <= max(sig.max_batch_size, 1)
    for sent, admitted in zip(request.inputs, work.inputs):
        data = admitted.data
        count = datatypes.element_count(sent.shape)
        size = datatypes.element_size(sent.datatype)
        if type(data) is RegionSlice:
            assert 0 <= data.offset and data.nbytes > 0
            assert data.offset + data.nbytes <= data.region.byte_size
            # The worker reads and checks BYTES elements in a region (test_runner's
            # test_bytes_in_a_region_are_checked_before_anything_is_allocated).
            if size:
                assert data.nbytes == count * size
            continue
        if size:
            assert _nbytes(data) == count * size
        else:
            datatypes.check_bytes(data, count)
    if request.template is not None:
        check_template_shortcut(request, model, work, batch_size)
    return work


def check_template_shortcut(request, model, work, batch_size):
    """The next request of a template makes the work request the full check made, and one
    whose tensor is a byte short is checked in full."""
    checked = CheckedTemplate.of(request, model, work, batch_size, 0, 0)
    if checked is None:
        assert work.regions or any(t.datatype == "BYTES" for t in request.inputs)
        return
    again = checked.work(request, model)
    assert again is not None and work_fields(again) == work_fields(work)
    assert checked.work(request, _model(model.name)) is None  # another signature
    for i, t in enumerate(request.inputs):
        if _nbytes(t.data):
            short = dataclasses.replace(request, inputs=list(request.inputs))
            short.inputs[i] = dataclasses.replace(t, data=bytes(t.data)[:-1])
            assert checked.work(short, model) is None


def work_fields(work):
    return (work.request_id, work.correlation_id, work.flags, work.parameters,
            [(w.name, w.datatype, w.shape, bytes(w.data)) for w in work.inputs],
            work.requested_outputs, work.output_regions, work.regions)


def _nbytes(data) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


# ---------------------------------------------------------------- near-valid requests
# Valid requests for a model's signature with one thing wrong (or none): random inputs alone
# rarely get past the first checks, these reach every later one and the success path.


def _tensor(draw, spec, batch):
    """(shape, numpy array or list of bytes) of a valid tensor for `spec`."""
    shape = ([batch] if batch else []) + [draw(st.integers(0, 3)) if d < 0 else d
                                          for d in spec.dims]
    count = datatypes.element_count(shape)
    if spec.datatype == "BYTES":
        return shape, draw(st.lists(st.text(max_size=4).map(str.encode), min_size=count,
                                    max_size=count))
    dtype = datatypes.numpy_dtype(spec.datatype)
    raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    array = np.frombuffer(raw, dtype).copy()
    if dtype.kind == "f":
        array[~np.isfinite(array)] = 0  # JSON has no NaN
    if spec.datatype == "BOOL":
        array = np.frombuffer(raw, np.uint8) % 2 == 1
    return shape, array


MUTATIONS = ["none", "datatype", "dim", "huge_dim", "negative_dim", "drop_input", "dup_input",
             "size_lie", "header", "tail", "shm_offset", "shm_size", "parameter", "no_data",
             "bytes_prefix"]


@st.composite
def near_valid_http(draw, model):
    """(mutation, (body, header length or None), expected) for `model`, with one of
    MUTATIONS applied; `expected`: each input's bytes, or (offset, bytes) for one that the
    request places in region "fuzz" (for a server to read, they must be written there)."""
    sig = model.signature
    mutation = draw(st.sampled_from(MUTATIONS))
    batch = draw(st.integers(1, sig.max_batch_size)) if sig.max_batch_size else 0
    items, tail, expected = [], b"", {}
    offset = 0
    for spec in sig.inputs.values():
        if spec.optional and draw(st.booleans()):
            continue
        shape, values = _tensor(draw, spec, batch)
        item = {"name": spec.name, "datatype": spec.datatype, "shape": shape}
        wire = (datatypes.serialize_bytes(values) if spec.datatype == "BYTES"
                else values.tobytes())
        where = draw(st.sampled_from(["json", "binary", "shm"]))
        if where == "json" and spec.datatype not in ("FP16", "BF16") and (
                spec.datatype != "BYTES" or all(v.isascii() for v in values)):
            item["data"] = ([v.decode() for v in values] if spec.datatype == "BYTES"
                            else values.tolist())
        elif where == "shm" and wire and offset + len(wire) <= REGION_BYTES:
            item["parameters"] = {"shared_memory_region": "fuzz", "shared_memory_offset": offset,
                                  "shared_memory_byte_size": len(wire)}
            offset, wire = offset + len(wire), (offset, wire)
        else:
            item["parameters"] = {"binary_data_size": len(wire)}
            tail += wire
        items.append(item)
        expected[spec.name] = wire
    doc = {"inputs": items, "outputs": [{"name": n} for n in sig.outputs]}
    if items:
        item = draw(st.sampled_from(items))
        params = item.setdefault("parameters", {})
        if mutation == "datatype":
            item["datatype"] = draw(DATATYPES)
        elif mutation in ("dim", "huge_dim", "negative_dim") and item["shape"]:
            at = draw(st.integers(0, len(item["shape"]) - 1))
            item["shape"][at] = {"dim": item["shape"][at] + 1, "huge_dim": HUGE,
                                 "negative_dim": -1}[mutation]
        elif mutation == "drop_input":
            items.remove(item)
        elif mutation == "dup_input":
            items.append(item)
        elif mutation == "size_lie" and "binary_data_size" in params:
            params["binary_data_size"] += draw(st.sampled_from([-1, 1, HUGE]))
        elif mutation == "shm_offset" and "shared_memory_offset" in params:
            params["shared_memory_offset"] = draw(st.sampled_from([REGION_BYTES, HUGE, -1]))
        elif mutation == "shm_size" and "shared_memory_byte_size" in params:
            params["shared_memory_byte_size"] = draw(st.sampled_from([0, REGION_BYTES + 1, HUGE]))
        elif mutation == "no_data":
            item.pop("data", None)
            params.clear()
        elif mutation == "bytes_prefix" and "binary_data_size" in params and tail:
            # the first length prefix of the tail claims more than there is
            tail = (0x7FFFFFFF).to_bytes(4, "little") + tail[4:]
    if mutation == "parameter":
        doc["parameters"] = {draw(st.sampled_from(["sequence_id", "priority", "timeout",
                                                   "binary_data_output", "triton_x", "p"])):
                             draw(SCALARS)}
    if mutation == "tail":
        tail += draw(st.binary(min_size=1, max_size=8))
    head = orjson.dumps(doc)
    header = len(head) if tail else None
    if mutation == "header":
        header = draw(st.one_of(st.none(), st.integers(-1, len(head) + len(tail) + 1)))
    return mutation, (head + tail, header), expected


@st.composite
def near_valid_grpc(draw, model):
    """(mutation, serialized ModelInferRequest, expected) for `model`, as near_valid_http."""
    sig = model.signature
    mutation = draw(st.sampled_from(MUTATIONS))
    batch = draw(st.integers(1, sig.max_batch_size)) if sig.max_batch_size else 0
    msg = proto.ModelInferRequest(model_name=model.name)
    expected = {}
    offset = 0
    typed = draw(st.booleans())  # typed contents, else raw_input_contents for every input
    for spec in sig.inputs.values():
        if spec.optional and draw(st.booleans()):
            continue
        shape, values = _tensor(draw, spec, batch)
        tensor = msg.inputs.add(name=spec.name, datatype=spec.datatype, shape=shape)
        wire = (datatypes.serialize_bytes(values) if spec.datatype == "BYTES"
                else values.tobytes())
        field = grpc_codec._CONTENTS_FIELD.get(spec.datatype)
        if draw(st.booleans()) and wire and offset + len(wire) <= REGION_BYTES:
            tensor.parameters["shared_memory_region"].string_param = "fuzz"
            tensor.parameters["shared_memory_offset"].int64_param = offset
            tensor.parameters["shared_memory_byte_size"].int64_param = len(wire)
            offset, wire = offset + len(wire), (offset, wire)
        elif typed and field:
            getattr(tensor.contents, field).extend(
                values if spec.datatype == "BYTES" else values.tolist())
        else:
            msg.raw_input_contents.append(wire)
        expected[spec.name] = wire
    for name in sig.outputs:
        msg.outputs.add(name=name)
    if msg.inputs:
        tensor = draw(st.sampled_from(list(msg.inputs)))
        params = tensor.parameters
        if mutation == "datatype":
            tensor.datatype = draw(DATATYPES)
        elif mutation in ("dim", "huge_dim", "negative_dim") and tensor.shape:
            at = draw(st.integers(0, len(tensor.shape) - 1))
            tensor.shape[at] = {"dim": tensor.shape[at] + 1, "huge_dim": HUGE,
                                "negative_dim": -1}[mutation]
        elif mutation == "drop_input":
            msg.inputs.remove(tensor)
        elif mutation == "dup_input":
            msg.inputs.add().CopyFrom(tensor)
        elif mutation == "size_lie" and msg.raw_input_contents:
            msg.raw_input_contents[0] += b"\0"
        elif mutation == "shm_offset" and "shared_memory_offset" in params:
            params["shared_memory_offset"].int64_param = draw(st.sampled_from(
                [REGION_BYTES, HUGE, -1]))
        elif mutation == "shm_size" and "shared_memory_byte_size" in params:
            params["shared_memory_byte_size"].int64_param = draw(st.sampled_from(
                [0, -1, REGION_BYTES + 1, HUGE]))
        elif mutation == "no_data":
            tensor.ClearField("contents")
            tensor.ClearField("parameters")
        elif mutation == "bytes_prefix" and msg.raw_input_contents:
            msg.raw_input_contents[0] = (0x7FFFFFFF).to_bytes(4, "little") + (
                msg.raw_input_contents[0][4:])
    if mutation == "parameter":
        _parameters(draw, msg.parameters)
    if mutation == "tail":
        msg.raw_input_contents.append(draw(st.binary(max_size=8)))
    wire = msg.SerializeToString()
    if mutation == "header":  # the message cut short
        wire = wire[:draw(st.integers(0, len(wire)))]
    return mutation, wire, expected


@FUZZ
@given(st.sampled_from(sorted(MODELS)).flatmap(
    lambda name: st.tuples(st.just(name), near_valid_http(MODELS[name]))))
def test_http_near_valid_requests(regions, case):
    model_name, (mutation, (body, header), expected) = case
    expect_inputs(mutation, http_property(body, header, regions, model_name), expected)


@FUZZ
@given(st.sampled_from(sorted(MODELS)).flatmap(
    lambda name: st.tuples(st.just(name), near_valid_grpc(MODELS[name]))))
def test_grpc_near_valid_requests(regions, case):
    model_name, (mutation, wire, expected) = case
    expect_inputs(mutation, grpc_property(wire, regions, model_name), expected)


def expect_inputs(mutation: str, work, expected: dict) -> None:
    """An unmutated request passes, each input with the bytes sent (or, for one in shared
    memory, the (offset, bytes) it is to find there)."""
    if mutation != "none":
        return
    assert work is not None, "a valid request was refused"
    got = {t.name: (t.data.offset, t.data.nbytes) if type(t.data) is RegionSlice
           else bytes(t.data) for t in work.inputs}
    assert got == {name: (wire[0], len(wire[1])) if type(wire) is tuple else wire
                   for name, wire in expected.items()}


# ---------------------------------------------------------------- HTTP infer


def http_property(body: bytes, header, manager, model_name: str):
    """The WorkRequest the body becomes for model `model_name`, or None if refused. A header
    decoded a second time (from its template) gives the same request."""
    http_codec._TEMPLATES.clear()
    decoded = outcome("http", decode_infer_request, body, header, "m", "")
    again = outcome(None, decode_infer_request, body, header, "m", "")
    assert (decoded is None) == (again is None)
    if decoded is None:
        return None
    request, fmt = decoded
    assert fields(again[0]) == fields(request) and again[1] == fmt
    start = len(body) if header is None else header
    binary = [t.data for t in request.inputs
              if isinstance(t.data, memoryview) and t.data.obj is body]
    # Binary inputs are the body after the JSON header, in order, all of it.
    assert sum(view.nbytes for view in binary) == len(body) - start
    return check_prepared(again[0], MODELS[model_name], manager)


@FUZZ
@given(http_bodies(), st.sampled_from(sorted(MODELS)))
def test_http_generated_bodies(regions, case, model_name):
    http_property(*case, regions, model_name)


@FUZZ
@given(st.binary(max_size=200), st.one_of(st.none(), st.integers(-2, 220)))
def test_http_random_bytes(regions, body, header):
    http_property(body, header, regions, "plain")


# ---------------------------------------------------------------- gRPC infer


def grpc_property(wire: bytes, manager, model_name: str):
    """As http_property. The protobuf parse and the splitter for large requests agree on
    every input."""
    answers = []
    for label, split_from in (("grpc", grpc_codec._SPLIT_FROM_BYTES), (None, 0)):
        original = grpc_codec._SPLIT_FROM_BYTES
        grpc_codec._SPLIT_FROM_BYTES = split_from
        try:
            parsed = outcome(label, grpc_codec.parse_model_infer_request, wire)
        finally:
            grpc_codec._SPLIT_FROM_BYTES = original
        answers.append(parsed and outcome(label, grpc_codec.decode_model_infer_request,
                                          *parsed))
    # The reader that decodes a request head once answers as the parse, on a miss and a hit.
    answers += [outcome(None, grpc_codec.read_model_infer_request, wire) for _ in range(2)]
    whole, split, missed, hit = answers
    assert (whole is None) == (split is None) == (missed is None) == (hit is None), answers
    if whole is None:
        return None
    assert fields(whole) == fields(split) == fields(missed) == fields(hit)
    return check_prepared(hit, MODELS[model_name], manager)


def fields(request):
    return (request.model_name, request.model_version, request.id, request.parameters,
            [(t.name, t.datatype, t.shape, None if t.data is None else bytes(t.data),
              t.parameters) for t in request.inputs],
            [(o.name, o.parameters) for o in request.outputs])


@FUZZ
@given(grpc_messages(), st.sampled_from(sorted(MODELS)))
def test_grpc_generated_messages(regions, msg, model_name):
    grpc_property(msg.SerializeToString(), regions, model_name)


@FUZZ
@given(st.one_of(st.binary(max_size=200), grpc_messages().flatmap(
    lambda msg: st.just(msg.SerializeToString()))).flatmap(
        lambda wire: st.builds(lambda cut, junk: wire[:cut] + junk,
                               st.integers(0, len(wire)), st.binary(max_size=12))))
def test_grpc_random_and_cut_bytes(regions, wire):
    grpc_property(wire, regions, "batching")


# Large messages made of one field shape over and over: what a client would send to make the
# decoder work, or allocate, for every few bytes (8 MiB of zeros cost 10 s and 1.1 GB).
_REPEATED_FIELDS = st.sampled_from([
    b"\0", b"\x0a\x00", b"\x2a\x00", b"\x3a\x00", b"\x08\x01", b"\x0b\x0c", b"\x3a\x01x",
    b"\x7a\x00", b"\x22\x00", b"\x2a\x02\x0a\x00", b"\x0d\0\0\0\0",
    b"\x2a\x0c\x0a\x01a\x12\x04FP32\x1a\x01\x01"])


def _read(wire: bytes) -> None:
    with contextlib.suppress(ServerError):
        grpc_codec.read_model_infer_request(wire)


@FUZZ
@given(st.lists(st.tuples(_REPEATED_FIELDS, st.integers(1, 60_000)), min_size=1, max_size=3),
       st.binary(max_size=8))
def test_grpc_decoding_costs_follow_the_message_size(parts, tail):
    wire = b"".join(field * count for field, count in parts) + tail
    run_bounded(_read, wire, max_lines=4 * len(wire) + 50_000)
    assert peak_allocation(_read, wire) < 16 * len(wire) + ALLOCATION_SLACK


def test_a_message_of_zeros_is_refused_at_its_first_field():
    wire = bytes(8 << 20)
    with pytest.raises(ServerError) as refused:
        run_bounded(grpc_codec.read_model_infer_request, wire, max_lines=1000)
    assert refused.value.code is Code.INVALID_ARG and "field number 0" in refused.value.message


# ---------------------------------------------------------------- configs


def _repository_configs() -> list[str]:
    texts = []
    for folder in ("model_repository", os.path.join("tests", "models")):
        base = os.path.join(ROOT, folder)
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name, "config.pbtxt")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    texts.append(f.read())
    return texts


REPOSITORY_CONFIGS = _repository_configs()
PBTXT_TOKENS = st.sampled_from(
    ["{", "}", "[", "]", ":", ",", "-1", "0", "99", "2147483648", "9223372036854775808",
     '"x"', "TYPE_FP32", "KIND_GPU", "KIND_AUTO", "name", "input", "output", "dims",
     "data_type", "reshape", "shape", "max_batch_size", "instance_group", "kind", "count",
     "gpus", "dynamic_batching", "preferred_batch_size", "sequence_batching", "control_input",
     "control", "batch_input", "source_input", "platform", "ensemble", "backend", "python",
     "\n", "#", "'", "\\", "\x00", "é"])


def config_property(text: str) -> None:
    config = outcome("config", parse_config_text, text)
    if config is None:
        return
    normalized = outcome("config_normalize", normalize_config, config, config.name or "m", 1)
    if normalized is None or normalized.platform == "ensemble":
        return
    # What loads must give a signature, and survive the text and JSON round trips.
    ModelSignature.from_config(normalized)
    assert parse_config_text(text_format.MessageToString(normalized)) == normalized
    assert parse_config_json(json_format.MessageToJson(normalized)) == normalized


@FUZZ
@given(st.sampled_from(REPOSITORY_CONFIGS).flatmap(lambda text: st.builds(
    lambda cuts: _splice(text, cuts), st.lists(st.tuples(
        st.integers(0, len(text)), st.integers(0, 12), st.lists(PBTXT_TOKENS, max_size=3)),
        min_size=1, max_size=3))))
def test_config_mutated_repository_configs(text):
    config_property(text)


@FUZZ
@given(st.lists(PBTXT_TOKENS, max_size=30).map(" ".join))
def test_config_random_token_text(text):
    config_property(text)


def _splice(text: str, cuts) -> str:
    for at, width, tokens in cuts:
        text = text[:at] + " ".join(tokens) + text[at + width:]
    return text


ENUM_NUMBERS = st.one_of(st.integers(0, 16), st.integers(-(2**31), 2**31 - 1))


@st.composite
def model_configs(draw):
    """Structured configs with any field value, unknown enum numbers included."""
    config = proto.ModelConfig(name="m", backend=draw(st.sampled_from(["python", "", "onnx"])),
                               max_batch_size=draw(st.integers(-2, 9)))
    for kind in ("input", "output"):
        for _ in range(draw(st.integers(0, 2))):
            tensor = getattr(config, kind).add(name=draw(NAMES), data_type=draw(ENUM_NUMBERS),
                                               dims=draw(st.lists(st.integers(-2, 2**40),
                                                                  max_size=3)))
            if draw(st.booleans()):
                tensor.reshape.shape.extend(draw(st.lists(st.integers(-2, 8), max_size=3)))
    for _ in range(draw(st.integers(0, 2))):
        config.instance_group.add(kind=draw(ENUM_NUMBERS), count=draw(st.integers(-2, 3)),
                                  gpus=draw(st.lists(st.integers(-2, 3), max_size=2)))
    if draw(st.booleans()):
        config.dynamic_batching.preferred_batch_size.extend(
            draw(st.lists(st.integers(-2, 12), max_size=2)))
        config.dynamic_batching.priority_levels = draw(st.integers(0, 3))
        config.dynamic_batching.default_priority_level = draw(st.integers(0, 4))
    elif draw(st.booleans()):
        for _ in range(draw(st.integers(1, 2))):
            control_input = config.sequence_batching.control_input.add(name=draw(NAMES))
            control = control_input.control.add(kind=draw(ENUM_NUMBERS),
                                                data_type=draw(ENUM_NUMBERS))
            control.int32_false_true.extend(draw(st.lists(st.integers(0, 1), max_size=3)))
    for _ in range(draw(st.integers(0, 1))):
        config.batch_input.add(kind=draw(ENUM_NUMBERS), data_type=draw(ENUM_NUMBERS),
                               source_input=draw(st.lists(NAMES, max_size=2)))
    for _ in range(draw(st.integers(0, 1))):
        config.batch_output.add(kind=draw(ENUM_NUMBERS), source_input=draw(
            st.lists(NAMES, max_size=2)), target_name=draw(st.lists(NAMES, max_size=2)))
    return config


@FUZZ
@given(model_configs())
def test_config_structured_values(config):
    config_property(text_format.MessageToString(config))


def _repository_json_configs() -> list[str]:
    texts = []
    for text in REPOSITORY_CONFIGS:
        with contextlib.suppress(ServerError):  # a test model's config is broken on purpose
            texts.append(json_format.MessageToJson(parse_config_text(text)))
    return texts


JSON_TOKENS = st.sampled_from(['{', '}', '[', ']', ':', ',', '"x"', '-1', '1e400', '"1"',
                               'null', 'true', '"TYPE_FP32"', '"KIND_GPU"', '99',
                               '9223372036854775808', '"dims"', '"maxBatchSize"'])


@FUZZ
@given(st.one_of(st.sampled_from(_repository_json_configs()).flatmap(lambda text: st.builds(
    lambda cuts: _splice(text, cuts), st.lists(st.tuples(
        st.integers(0, len(text)), st.integers(0, 8), st.lists(JSON_TOKENS, max_size=2)),
        min_size=1, max_size=2))), JSON.map(lambda v: orjson.dumps(v).decode()), st.dictionaries(
    st.sampled_from(["name", "max_batch_size", "maxBatchSize", "input", "instance_group",
                     "dynamic_batching", "parameters", "x"]), JSON, max_size=4).map(
        lambda d: orjson.dumps(d).decode()), st.text(max_size=40)))
def test_config_json(text):
    config = outcome("config_json", parse_config_json, text)
    if config is not None:
        outcome("config_normalize", normalize_config, config, config.name or "m", 0)


# ---------------------------------------------------------------- generate


@FUZZ
@given(st.one_of(st.dictionaries(st.sampled_from(["INPUT0", "INPUT1", "x", "id", "parameters",
                                                  "triton_x", "p"]), JSON, max_size=4),
                 JSON).map(orjson.dumps) | st.binary(max_size=60),
       st.sampled_from(sorted(MODELS)))
def test_generate_requests(regions, body, model_name):
    model = MODELS[model_name]
    request = outcome("generate", generate.decode_generate_request, body, "m", "",
                      model.signature)
    if request is None:
        return
    # generate derives shapes from the signature: with every required input given, the
    # dataplane must take them.
    prepared = outcome(None, prepare, request, model, regions)
    required = {n for n, s in model.signature.inputs.items() if not s.optional}
    assert prepared is not None or not required <= {t.name for t in request.inputs}


@FUZZ
@given(st.lists(st.tuples(NAMES, st.sampled_from(sorted(datatypes.WIRE_TYPES)),
                          st.lists(st.integers(0, 4), max_size=3), st.binary(max_size=24)),
                max_size=3),
       st.dictionaries(st.sampled_from(["id", "p", "OUTPUT0"]), SCALARS, max_size=2))
def test_generate_and_infer_responses(outputs, parameters):
    """Outputs as a worker may hand them over (any datatype, shape and bytes the model's
    tensors may have): the encoders answer JSON or a ServerError (INTERNAL for bytes that do
    not fit the shape)."""
    response = InferResponse("m", "1", "", parameters, [OutputTensor(*o) for o in outputs])
    codes = CLIENT_CODES | {Code.INTERNAL}
    payload = outcome("generate", generate.encode_generate_response, response, codes=codes)
    if payload is not None:
        event = generate.sse_data(payload)
        assert event.count(b"\n") == 2 and event.endswith(b"\n\n")
        assert isinstance(orjson.loads(payload), dict)
    fmt = OutputFormat(binary_default=bool(len(outputs) % 2))
    encoded = outcome("http_out", encode_infer_response, response, fmt, codes=codes)
    if encoded is not None:
        chunks, header, _ = encoded
        orjson.loads(chunks[0])
        assert header is None or header == len(chunks[0])


# ---------------------------------------------------------------- shared memory


@FUZZ
@given(st.text(max_size=6), st.one_of(st.text(max_size=300), st.sampled_from(
    ["", "/", ".", "..", "/dev/shm", "x/y", "triton_python_backend_shm_region_1", "\x00"])),
    SIZES, SIZES, st.booleans())
def test_shm_register(regions, name, key, offset, byte_size, ours):
    manager = SharedMemoryManager()
    if ours:
        key = regions.key
    outcome("shm_register", manager.register_system, name, key, offset, byte_size)
    if manager.system_status():
        assert ours and 0 <= offset and 0 < byte_size and offset + byte_size <= REGION_BYTES


@FUZZ
@given(st.dictionaries(st.sampled_from(["shared_memory_offset", "shared_memory_byte_size"]),
                       SIZES), st.sampled_from(["fuzz", "nope", ""]))
def test_shm_references(regions, params, region):
    piece = outcome("shm_slice", regions.slice, {"shared_memory_region": region, **params})
    if piece is not None:
        assert 0 <= piece.offset and 0 < piece.nbytes
        assert piece.offset + piece.nbytes <= REGION_BYTES


@FUZZ
@given(st.text(max_size=100))
def test_cuda_raw_handle(text):
    raw = outcome("shm_register", decode_raw_handle, text)
    assert raw is None or len(raw) == 64


_TRACE_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
              st.sampled_from(["OFF", "TIMESTAMPS", "TENSORS", "0", "1", "-1", "-2", "1000",
                               "4294967296", " 7", "1e3", ""]), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=2)),
    max_leaves=6)


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(SETTING_NAMES), st.text(max_size=8)),
                       _TRACE_VALUES, max_size=6), st.sampled_from(["", "m"]))
def test_trace_settings(body, model):
    tracer = Tracer(TraceSettings(file="trace.json"))  # no trace is taken: nothing is written
    before = tracer.settings(model)
    changes = outcome("trace_settings", _trace_changes, body)
    after = None
    if changes is not None:
        after = outcome(None, lambda: tracer.update(model, parse_changes(changes)))
    if after is None:
        assert tracer.settings(model) == before  # a refused change changes nothing
        return
    assert after == tracer.settings(model)
    levels = after["trace_level"]
    assert levels == ["OFF"] or (levels and set(levels) <= {"TIMESTAMPS", "TENSORS"})
    assert 1 <= int(after["trace_rate"]) < 2**32 and int(after["trace_count"]) >= -1
    assert int(after["log_frequency"]) >= 0


# ---------------------------------------------------------------- claims of 100 GB


def _json_body(doc, tail=b""):
    head = orjson.dumps(doc)
    return head + tail, len(head)


def _grpc_request(shape, raw=b"", contents=None):
    msg = proto.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    if contents is not None:
        tensor.contents.fp32_contents.extend(contents)
    else:
        msg.raw_input_contents.append(raw)
    return msg


def _http_claim(regions, doc, tail=b""):
    body, header = _json_body(doc, tail)
    http_property(body, header, regions, "batching")


def _grpc_claim(regions, msg):
    grpc_property(msg.SerializeToString(), regions, "batching")


CLAIMS = {
    "binary_data_size": lambda r: _http_claim(r, {"inputs": [{
        "name": "INPUT0", "datatype": "FP32", "shape": [1, HUGE // 4],
        "parameters": {"binary_data_size": HUGE}}]}, b"\0" * 16),
    "header_length": lambda r: http_property(b"{}", HUGE, r, "batching"),
    "json_shape": lambda r: _http_claim(r, {"inputs": [{
        "name": "INPUT0", "datatype": "FP32", "shape": [1, HUGE], "data": [1.0] * 4}]}),
    "json_bytes_shape": lambda r: _http_claim(r, {"inputs": [{
        "name": "INPUT1", "datatype": "BYTES", "shape": [HUGE, 2], "data": ["a"] * 4}]}),
    "binary_bytes_shape": lambda r: _http_claim(r, {"inputs": [{
        "name": "INPUT1", "datatype": "BYTES", "shape": [1, HUGE],
        "parameters": {"binary_data_size": 8}}]}, b"\xff\xff\xff\x7f" + b"\0" * 4),
    # Passed on to the worker, which checks the elements before it allocates for them.
    "shm_bytes_shape": lambda r: _http_claim(r, {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 0], "data": []},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [1, HUGE], "parameters": {
            "shared_memory_region": "fuzz", "shared_memory_byte_size": 8}}]}),
    "shm_byte_size": lambda r: _http_claim(r, {"inputs": [{
        "name": "INPUT0", "datatype": "FP32", "shape": [1, HUGE // 4], "parameters": {
            "shared_memory_region": "fuzz", "shared_memory_byte_size": HUGE}}]}),
    "grpc_shape": lambda r: _grpc_claim(r, _grpc_request([1, HUGE], b"\0" * 16)),
    "grpc_contents_shape": lambda r: _grpc_claim(r, _grpc_request([1, HUGE],
                                                                  contents=[1.0] * 4)),
    # A length prefix that claims 100 GB (and a varint of the largest length) in a large
    # request, which the splitter reads itself.
    "grpc_length_prefix": lambda r: grpc_property(
        b"\x3a" + grpc_codec._varint(HUGE) + b"\0" * 70000, r, "batching"),
    "grpc_max_varint": lambda r: grpc_property(
        b"\x3a" + b"\xff" * 9 + b"\x01" + b"\0" * 70000, r, "batching"),
    "shm_register": lambda r: outcome("shm_register", SharedMemoryManager().register_system,
                                      "big", r.key, 0, HUGE),
    "config_dims": lambda r: config_property(
        'name: "m" backend: "python" max_batch_size: 2147483647 input { name: "a" data_type: '
        'TYPE_FP32 dims: [ 100000000000, 100000000000 ] reshape { shape: [ -1 ] } }'),
    "generate_bytes": lambda r: outcome("generate", generate.decode_generate_request,
                                        b'{"INPUT1": ["ab", "cd"]}', "m", "",
                                        ModelSignature(8, {"INPUT1": MODELS["batching"]
                                                           .signature.inputs["INPUT1"]}, {})),
}


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_claims_allocate_nothing(regions, claim):
    # 70 kB of input at most: whatever the claim, a decoder may not need more than this.
    assert peak_allocation(CLAIMS[claim], regions, answers=(ServerError,)) < (
        16 * 70_000 + ALLOCATION_SLACK)


@FUZZ
@given(http_bodies(), grpc_messages())
def test_allocation_follows_the_input(regions, case, msg):
    """The generated inputs are all small; so must be what decoding them takes."""
    body, header = case
    wire = msg.SerializeToString()
    assert peak_allocation(http_property, body, header, regions, "batching",
                           answers=(ServerError,)) < (
        64 * len(body) + ALLOCATION_SLACK)
    assert peak_allocation(grpc_property, wire, regions, "plain", answers=(ServerError,)) < (
        64 * len(wire) + ALLOCATION_SLACK)


def test_inputs_decode_as_sent(regions):
    """The generators above reach the success path too: a sanity check that a well-formed
    request of each kind passes every layer (else the properties would test only errors)."""
    body, header = _json_body({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2]},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [1, 2],
         "parameters": {"binary_data_size": 10}}]}, b"\1\0\0\0a\1\0\0\0b")
    request, _ = decode_infer_request(body, header, "m", "")
    work, batch = prepare(request, MODELS["batching"], regions)
    assert batch == 1 and bytes(work.inputs[0].data) == np.array([1.5, 2], "<f4").tobytes()
    msg = _grpc_request([1, 4], np.arange(4, dtype="<f4").tobytes())
    msg.inputs[0].parameters["shared_memory_region"].string_param = "fuzz"
    msg.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    del msg.raw_input_contents[:]
    request = grpc_codec.decode_model_infer_request(msg)
    work, _ = prepare(request, MODELS["batching"], regions)
    assert work.inputs[0].data.nbytes == 16
    request = generate.decode_generate_request(b'{"INPUT0": [1, 2]}', "m", "",
                                               MODELS["batching"].signature)
    assert prepare(request, MODELS["batching"], regions)[0].inputs[0].shape == [1, 2]


@pytest.mark.parametrize("wire", [b"\x0b\x0c", b"\x0b\x3a\x01a\x0c", b"\x3a\x01a\x0b\x3a\x01b\x0c",
                                  b"\x0c", b"\x0b"])
def test_grpc_unknown_groups_parse_as_protobuf_does(regions, wire):
    """Unknown fields may be groups; the splitter of large requests must take them as
    protobuf does (it refused them)."""
    grpc_property(wire, regions, "batching")


@pytest.mark.parametrize("datatype", ["BYTES", "FP32", "BOOL", "UINT64"])
@pytest.mark.parametrize("depth", [31, 33, 65, 999, 1020])
def test_http_deeply_nested_data(regions, datatype, depth):
    """JSON nests arrays as deep as orjson allows (1024), deeper than Python's recursion limit
    (BYTES data raised RecursionError)."""
    element = '"x"' if datatype == "BYTES" else "true" if datatype == "BOOL" else "1"
    body = (f'{{"inputs":[{{"name":"INPUT0","datatype":"{datatype}","shape":[1,1],"data":'
            + "[" * depth + element + "]" * depth + "}]}").encode()
    http_property(body, None, regions, "batching")


def test_config_enum_number_beyond_32_bits():
    """protobuf's text parser raised ValueError for it, not ParseError (found by atheris)."""
    config_property('input [ { name: "IN" data_type: 5555555555555555555555 dims: [ 1 ] } ]')
