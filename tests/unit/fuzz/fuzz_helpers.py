"""What the fuzz modules of tests/unit/fuzz/ share: the property every decoder of client input
must keep (`outcome`: a correct result or a ServerError with a message and a client-facing code,
never another exception), the hypothesis strategies of HTTP infer bodies and gRPC
ModelInferRequests, the two models requests meet and the client region "fuzz" they may name,
and the HTTP, gRPC and config properties (`http_property`, `grpc_property`, `config_property`:
a decoder, then the dataplane's check of what it admits). perf/fuzz_decoders.py runs the same
properties much longer; tests/e2e/test_fuzz_server.py sends the same generated requests to a
real server.
"""

import contextlib
import dataclasses
import os
from types import SimpleNamespace

import orjson
import posix_ipc
from google.protobuf import json_format, text_format
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from shmserve import proto
from shmserve.admission import prepare
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import parse_config_json, parse_config_text
from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.errors import Code, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.fastpath.checked_templates import CheckedTemplate
from shmserve.grpc import codec as grpc_codec
from shmserve.http import codec as http_codec
from shmserve.http.codec import decode_infer_request
from shmserve.ipc import datatypes
from shmserve.signature import ModelSignature


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
