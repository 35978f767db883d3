"""Generated bad input for the decoders of infer requests, the HTTP infer body (JSON and the
binary extension) and the gRPC ModelInferRequest, through to the dataplane's validation:
near-valid requests (valid for a model's signature but for one mutation, so that every later
check and the success path are reached), generated and random bodies and messages, messages cut
short, unknown protobuf groups, JSON nested as deep as orjson allows, and messages of one field
over and over, whose decoding must cost work and memory in proportion to their size. The
property is fuzz_helpers': a correct result or a ServerError with a client-facing code.
"""

import contextlib

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmserve import proto
from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.errors import Code, ServerError
from shmserve.grpc import codec as grpc_codec
from shmserve.ipc import datatypes
from tests.unit.bounds import peak_allocation, run_bounded
from tests.unit.fuzz.fuzz_helpers import (ALLOCATION_SLACK, DATATYPES, FUZZ, HUGE, MODELS,
                                          REGION_BYTES, SCALARS, _parameters, grpc_messages,
                                          grpc_property, http_bodies, http_property)


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


@FUZZ
@given(http_bodies(), st.sampled_from(sorted(MODELS)))
def test_http_generated_bodies(regions, case, model_name):
    http_property(*case, regions, model_name)


@FUZZ
@given(st.binary(max_size=200), st.one_of(st.none(), st.integers(-2, 220)))
def test_http_random_bytes(regions, body, header):
    http_property(body, header, regions, "plain")


@pytest.mark.parametrize("datatype", ["BYTES", "FP32", "BOOL", "UINT64"])
@pytest.mark.parametrize("depth", [31, 33, 65, 999, 1020])
def test_http_deeply_nested_data(regions, datatype, depth):
    """JSON nests arrays as deep as orjson allows (1024), deeper than Python's recursion limit
    (BYTES data raised RecursionError)."""
    element = '"x"' if datatype == "BYTES" else "true" if datatype == "BOOL" else "1"
    body = (f'{{"inputs":[{{"name":"INPUT0","datatype":"{datatype}","shape":[1,1],"data":'
            + "[" * depth + element + "]" * depth + "}]}").encode()
    http_property(body, None, regions, "batching")


# ---------------------------------------------------------------- gRPC infer


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


@pytest.mark.parametrize("wire", [b"\x0b\x0c", b"\x0b\x3a\x01a\x0c", b"\x3a\x01a\x0b\x3a\x01b\x0c",
                                  b"\x0c", b"\x0b"])
def test_grpc_unknown_groups_parse_as_protobuf_does(regions, wire):
    """Unknown fields may be groups; the splitter of large requests must take them as
    protobuf does (it refused them)."""
    grpc_property(wire, regions, "batching")
