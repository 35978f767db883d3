"""Claims of 100 GB (a binary data size, a header length, a shape, a protobuf length prefix, a
region's byte size, a config's dims) allocate nothing before they are checked: what decoding a
request takes follows its size, never a size it claims, for hand-made claims and for generated
HTTP bodies and gRPC messages. With a sanity check that a well-formed request of each kind
(HTTP, gRPC, generate) passes every layer, so that the generated inputs reach the success path
too.
"""

import numpy as np
import orjson
import pytest
from hypothesis import given

from shmserve import proto
from shmserve.admission import prepare
from shmserve.errors import ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.grpc import codec as grpc_codec
from shmserve.http import generate
from shmserve.http.codec import decode_infer_request
from shmserve.signature import ModelSignature
from tests.unit.bounds import peak_allocation
from tests.unit.fuzz.fuzz_helpers import (ALLOCATION_SLACK, FUZZ, HUGE, MODELS, config_property,
                                          grpc_messages, grpc_property, http_bodies,
                                          http_property, outcome)


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
