"""HTTP infer codec against the bodies tritonclient really builds and parses."""

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import serialize_byte_tensor

from shmserve.errors import Code, ServerError
from shmserve.http import codec
from shmserve.http.codec import (
    OutputFormat,
    decode_infer_request,
    encode_infer_response,
    json_input_bytes,
)
from shmserve.inference import InferResponse, OutputTensor
from shmserve.ipc import datatypes

SAMPLES = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0]], dtype=np.float16),
    "FP32": np.array([[0.1, -2.5, 3.4e38], [1e-30, 0.0, 7.0]], dtype=np.float32),
    "FP64": np.array([[0.1, -2.5, 1e300]], dtype=np.float64),
    "BF16": np.array([[0.5, -1.25, 3.0]], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([[b"abc", b"", "h\u00e9llo".encode()]], dtype=np.object_),
}
JSON_TYPES = [t for t in SAMPLES if t not in ("FP16", "BF16")]


def wire_bytes(datatype):
    array = SAMPLES[datatype]
    if datatype == "BYTES":
        return serialize_byte_tensor(array).item()
    return array.tobytes()


def make_input(name, datatype, binary=True):
    tensor = httpclient.InferInput(name, list(SAMPLES[datatype].shape), datatype)
    tensor.set_data_from_numpy(SAMPLES[datatype], binary_data=binary)
    return tensor


def client_body(inputs, outputs=None, **kwargs):
    return httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kwargs)


def decode(body, header_length=None):
    return decode_infer_request(body, header_length, "m", "")


def raw_body(doc, tail=b""):
    head = orjson.dumps(doc)
    return head + tail, (len(head) if tail else None)


def invalid(body, header_length=None):
    with pytest.raises(ServerError) as info:
        decode(body, header_length)
    assert info.value.code is Code.INVALID_ARG
    return info.value.message


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_input_every_datatype(datatype):
    body, header_length = client_body([make_input("x", datatype)])
    request, _ = decode(body, header_length)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, list(SAMPLES[datatype].shape))
    assert isinstance(tensor.data, memoryview) and tensor.data.obj is body  # a slice, not a copy
    assert bytes(tensor.data) == wire_bytes(datatype)
    assert tensor.parameters == {}


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_input_every_datatype(datatype):
    body, header_length = client_body([make_input("x", datatype, binary=False)])
    assert header_length is None
    request, _ = decode(body, header_length)
    assert bytes(request.inputs[0].data) == wire_bytes(datatype)


def test_nested_json_data_is_flattened_row_major():
    body, _ = raw_body({"inputs": [
        {"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
        {"name": "b", "datatype": "FP64", "shape": [4], "data": [[1, 2.5], [3, 4]]},
        {"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": [["x"], ["yz"]]},
        {"name": "e", "datatype": "FP32", "shape": [0, 3], "data": []},
    ]})
    request, _ = decode(body)
    a, b, s, e = request.inputs
    assert bytes(a.data) == np.array([1, 2, 3, 4], "<i4").tobytes()
    assert bytes(b.data) == np.array([1, 2.5, 3, 4], "<f8").tobytes()
    assert bytes(s.data) == datatypes.serialize_bytes([b"x", b"yz"])
    assert bytes(e.data) == b""


def test_mixed_inputs_take_binary_slices_in_order():
    shm = httpclient.InferInput("s", [4], "FP32").set_shared_memory("region", 16, offset=32)
    inputs = [
        make_input("a", "INT64"),
        make_input("j", "INT16", binary=False),
        shm,
        make_input("b", "BYTES"),
        make_input("c", "FP16"),
    ]
    body, header_length = client_body(inputs)
    request, _ = decode(body, header_length)
    a, j, s, b, c = request.inputs
    assert bytes(a.data) == wire_bytes("INT64")
    assert bytes(j.data) == wire_bytes("INT16")
    assert bytes(b.data) == wire_bytes("BYTES")
    assert bytes(c.data) == wire_bytes("FP16")
    assert s.data is None
    assert s.parameters == {
        "shared_memory_region": "region",
        "shared_memory_byte_size": 16,
        "shared_memory_offset": 32,
    }


def test_zero_size_binary_input():
    empty = httpclient.InferInput("z", [0], "FP32")
    empty.set_data_from_numpy(np.zeros(0, np.float32))
    body, header_length = client_body([empty, make_input("a", "UINT8")])
    request, _ = decode(body, header_length)
    assert bytes(request.inputs[0].data) == b""
    assert bytes(request.inputs[1].data) == wire_bytes("UINT8")


def test_request_id_and_parameters():
    body, header_length = client_body(
        [make_input("a", "FP32")],
        outputs=[httpclient.InferRequestedOutput("o")],
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        priority=3,
        timeout=1000,
        parameters={"flag": True, "ratio": 0.5, "name": "x", "count": 9},
    )
    request, fmt = decode(body, header_length)
    assert (request.model_name, request.model_version, request.id) == ("m", "", "req-7")
    assert request.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 3,
        "timeout": 1000,
        "flag": True,
        "ratio": 0.5,
        "name": "x",
        "count": 9,
    }


def test_no_outputs_means_binary_default_from_client():
    body, header_length = client_body([make_input("a", "FP32")])
    request, fmt = decode(body, header_length)
    assert request.outputs == [] and request.parameters == {}
    assert fmt.is_binary("anything")


def test_requested_outputs_and_format():
    shm_out = httpclient.InferRequestedOutput("s")
    shm_out.set_shared_memory("out_region", 64, offset=8)
    outputs = [
        httpclient.InferRequestedOutput("b"),
        httpclient.InferRequestedOutput("j", binary_data=False),
        httpclient.InferRequestedOutput("c", binary_data=False, class_count=3),
        shm_out,
    ]
    body, header_length = client_body([make_input("a", "FP32")], outputs=outputs)
    request, fmt = decode(body, header_length)
    assert [(o.name, o.parameters) for o in request.outputs] == [
        ("b", {}),
        ("j", {}),
        ("c", {"classification": 3}),
        ("s", {"shared_memory_region": "out_region", "shared_memory_byte_size": 64,
               "shared_memory_offset": 8}),
    ]
    assert fmt.is_binary("b") and not fmt.is_binary("j") and not fmt.is_binary("c")
    assert not fmt.is_binary("unlisted")
    assert fmt.in_shared_memory("s") and not fmt.in_shared_memory("b")


def test_listed_output_without_binary_data_is_json_whatever_the_default():
    body, _ = raw_body({"parameters": {"binary_data_output": True},
                        "inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [1]}],
                        "outputs": [{"name": "listed"}]})
    request, fmt = decode(body)
    assert [(o.name, o.parameters) for o in request.outputs] == [("listed", {})]
    assert not fmt.is_binary("listed") and fmt.is_binary("unlisted")


def test_binary_data_output_false_keeps_json_default():
    body, _ = raw_body({"parameters": {"binary_data_output": False},
                        "inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [1]}]})
    request, fmt = decode(body)
    assert request.parameters == {} and not fmt.is_binary("o")


# ---------------------------------------------------------------- decode errors


@pytest.mark.parametrize("header_length", [-1, 100])
def test_header_length_out_of_range(header_length):
    assert invalid(b'{"inputs": []}', header_length).startswith("inference header size should be in range")


def test_malformed_json():
    assert invalid(b'{"inputs": [').startswith("failed to parse the request JSON buffer: ")
    assert invalid(b"[1]").startswith("failed to parse the request JSON buffer: ")
    # Deeper than Python's parser goes, on every version (it reads NaN, which orjson does
    # not; 3.12 goes past 1,500 levels): still a 400.
    deep = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":' + b"[" * 200_000 \
        + b"NaN" + b"]" * 200_000 + b"}]}"
    assert invalid(deep).startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize("doc, text", [
    ({"id": 5, "inputs": []}, "Unable to parse 'id'"),
    ({"inputs": {}}, "Unable to parse 'inputs'"),
    ({}, "Unable to parse 'inputs'"),
    ({"parameters": [], "inputs": []}, "Unable to parse 'parameters'"),
    ({"parameters": {"triton_x": 1}, "inputs": []}, "reserved for Triton usage"),
    ({"parameters": {"p": [1]}, "inputs": []}, "parameter 'p' has invalid type"),
    ({"parameters": {"binary_data_output": 1}, "inputs": []}, "Unable to parse 'binary_data_output'"),
    ({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, "Unable to parse 'name'"),
    ({"inputs": [{"name": "a", "datatype": "FP8", "shape": [1], "data": [1]}]}, "invalid datatype 'FP8'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1], "data": [1]}]}, "Unable to parse 'shape'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}]}, "But no field is set"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1],
                  "parameters": {"shared_memory_region": "r"}}]}, "But set 'data' 'shared_memory_region'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1],
                  "parameters": {"shared_memory_region": 3}}]}, "Unable to parse 'shared_memory_region'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1],
                  "parameters": {"shared_memory_region": "r", "shared_memory_offset": -4}}]},
     "Unable to parse 'shared_memory_offset'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1],
                  "parameters": {"binary_data_size": "4"}}]}, "Unable to parse 'binary_data_size'"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [3], "data": [1, 2]}]},
     "unexpected number of elements for input 'a'"),
    ({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [3], "data": ["x"]}]},
     "unexpected number of elements for input 'a'"),
    ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [3], "data": [[1, 2], [3]]}]},
     "Unable to parse 'data' of input 'a'"),
    ({"inputs": [{"name": "a", "datatype": "FP16", "shape": [1], "data": [1]}]},
     "receiving FP16 data via JSON is not supported. Please use the binary data format for input a"),
    ({"inputs": [{"name": "a", "datatype": "BF16", "shape": [1], "data": [1]}]},
     "receiving BF16 data via JSON is not supported"),
    ({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": [1]}]},
     "expected BYTES as JSON strings"),
    ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1.5]}]}, "expected INT32 values"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [True]}]}, "expected FP32 values"),
    ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1.5, False]}]},
     "expected FP32 values"),
    ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, True]]}]},
     "expected INT32 values"),
    ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2], "data": [1.0, True]}]},
     "expected INT64 values"),
    ({"inputs": [{"name": "a", "datatype": "BOOL", "shape": [1], "data": [1]}]}, "expected BOOL values"),
    ({"inputs": [{"name": "a", "datatype": "UINT8", "shape": [1], "data": [256]}]}, "out of range for UINT8"),
    ({"inputs": [{"name": "a", "datatype": "UINT64", "shape": [1], "data": [-1]}]}, "out of range for UINT64"),
    ({"inputs": [{"name": "a", "datatype": "UINT64", "shape": [2], "data": [-1, 2**63]}]},
     "out of range for UINT64"),
    ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "data": [2**63]}]}, "out of range for INT64"),
    ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1e30]}]}, "expected INT32 values"),
    # Triton takes only JSON integers for integer datatypes, 1.0 not among them.
    ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [2], "data": [1, 1.0]}]}, "expected INT32 values"),
    ({"inputs": [{"name": "a", "datatype": "UINT64", "shape": [2], "data": [[2**64 - 1], [1.0]]}]},
     "expected UINT64 values"),
    ({"inputs": [{"name": "a", "datatype": "UINT64", "shape": [2], "data": [1.5, 2**64 - 1]}]},
     "expected UINT64 values"),
    ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": 5}]}, "expected a JSON array"),
    ({"inputs": [], "outputs": {}}, "Unable to parse 'outputs'"),
    ({"inputs": [], "outputs": [{"name": "o", "parameters": {"binary_data": 1}}]},
     "Unable to parse 'binary_data'"),
    ({"inputs": [], "outputs": [{"name": "o", "parameters": {"classification": -1}}]},
     "Unable to set 'classification'"),
    ({"inputs": [], "outputs": [{"name": "o", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 4, "classification": 2}}]},
     "Output can't set both 'shared_memory_region' and 'classification'"),
    ({"inputs": [], "outputs": [{"name": "o", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 4, "binary_data": True}}]},
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
])
def test_invalid_request(doc, text):
    body, header_length = raw_body(doc)
    assert text in invalid(body, header_length)


def test_a_repeated_header_is_decoded_once():
    codec._TEMPLATES.clear()
    body, header_length = client_body(
        [make_input("a", "FP32"), make_input("b", "BYTES")],
        [httpclient.InferRequestedOutput("y", binary_data=True)], request_id="7",
        parameters={"p": 1})
    first, fmt = decode(body, header_length)
    again = bytearray(body)
    again[header_length:header_length + 4] = b"\x00" * 4
    second, second_fmt = decode(again, header_length)
    assert len(codec._TEMPLATES) == 1 and second_fmt == fmt
    assert bytes(second.inputs[0].data) == bytes(again[header_length:header_length + 24])
    assert bytes(second.inputs[1].data) == wire_bytes("BYTES")
    assert (second.model_name, second.id, second.parameters) == ("m", "7", {"p": 1})
    assert [(t.name, t.datatype, t.shape) for t in second.inputs] == [
        ("a", "FP32", [2, 3]), ("b", "BYTES", [1, 3])]
    assert [o.name for o in second.outputs] == ["y"] and fmt.is_binary("y")
    # Each request has its own parameters and shapes, which the server may change.
    first.parameters["q"] = 2
    first.inputs[0].shape[0] = 9
    third, _ = decode(body, header_length)
    assert third.parameters == {"p": 1} and third.inputs[0].shape == [2, 3]
    # The same header before fewer bytes is refused as it would be the first time.
    assert invalid(body[:-1], header_length).startswith("unexpected size for input 'b'")


def test_json_data_is_decoded_each_time():
    codec._TEMPLATES.clear()
    body, header_length = client_body([make_input("a", "INT32", binary=False)])
    for _ in range(2):
        request, _ = decode(body, header_length)
        assert bytes(request.inputs[0].data) == wire_bytes("INT32")
    assert not codec._TEMPLATES


def test_binary_data_too_short():
    body, header_length = client_body([make_input("a", "FP32")])
    message = invalid(body[:-3], header_length)
    assert message == "unexpected size for input 'a', expecting 3 additional bytes for model 'm'"


def test_binary_data_too_long():
    body, header_length = client_body([make_input("a", "FP32")])
    assert invalid(body + b"\x00", header_length) == "unexpected additional input data for model 'm'"


def test_binary_data_without_header_length():
    body, _ = client_body([make_input("a", "FP32")])
    assert invalid(body).startswith("failed to parse the request JSON buffer")


# ---------------------------------------------------------------- encode


def output(name, datatype):
    return OutputTensor(name, datatype, list(SAMPLES[datatype].shape), wire_bytes(datatype))


def parse(chunks, header_length):
    return httpclient.InferenceServerClient.parse_response_body(b"".join(chunks), header_length=header_length)


def assert_same(datatype, got, binary):
    want = SAMPLES[datatype]
    assert got.shape == want.shape
    if datatype == "BF16":
        assert got.tobytes() == want.tobytes()
    elif datatype == "BYTES" and not binary:
        assert got.tolist() == [[v.decode() for v in row] for row in want.tolist()]
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_output_every_datatype(datatype):
    out = output("o", datatype)
    response = InferResponse("m", "1", outputs=[out])
    chunks, header_length, content_type = encode_infer_response(response, OutputFormat(binary_default=True))
    assert content_type == "application/octet-stream"
    assert header_length == len(chunks[0]) and chunks[1] is out.data  # bytes passed through, not copied
    result = parse(chunks, header_length)
    assert_same(datatype, result.as_numpy("o"), binary=True)


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_output_every_datatype(datatype):
    response = InferResponse("m", "1", outputs=[output("o", datatype)])
    chunks, header_length, content_type = encode_infer_response(response, OutputFormat())
    assert (len(chunks), header_length, content_type) == (1, None, "application/json")
    assert_same(datatype, parse(chunks, header_length).as_numpy("o"), binary=False)


def test_json_fp32_output_is_the_exact_double_as_triton_writes_it():
    data = np.array([0.1, 3.4e38, -2.5], np.float32)
    response = InferResponse("m", "1", outputs=[OutputTensor("o", "FP32", [3], memoryview(data).cast("B"))])
    chunks, _, _ = encode_infer_response(response, OutputFormat())
    written = orjson.loads(chunks[0])["outputs"][0]["data"]
    assert written == [0.10000000149011612, 3.3999999521443642e+38, -2.5]
    assert np.array_equal(np.array(written, np.float32), data)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_fp16_input_without_elements_is_taken(datatype):
    # Triton refuses FP16 and BF16 values in JSON; an empty array has none to refuse.
    request, _ = decode(orjson.dumps({"inputs": [
        {"name": "a", "datatype": datatype, "shape": [2, 0], "data": [[], []]}]}))
    assert bytes(request.inputs[0].data) == b""


def test_an_output_listed_twice_takes_its_first_listings_format():
    request, fmt = decode(orjson.dumps({"inputs": [], "outputs": [
        {"name": "o"}, {"name": "o", "parameters": {"binary_data": True}}]}))
    assert not fmt.is_binary("o")


def test_json_output_is_flat_and_header_fields():
    data = np.arange(6, dtype="<i4")
    response = InferResponse("m", "3", id="r1", parameters={"p": 1, "q": "s"},
                             outputs=[OutputTensor("o", "INT32", [2, 3], memoryview(data).cast("B"),
                                                   parameters={"k": True})])
    chunks, _, _ = encode_infer_response(response, OutputFormat())
    assert orjson.loads(chunks[0]) == {
        "id": "r1",
        "model_name": "m",
        "model_version": "3",
        "parameters": {"p": 1, "q": "s"},
        "outputs": [{"name": "o", "datatype": "INT32", "shape": [2, 3],
                     "parameters": {"k": True}, "data": [0, 1, 2, 3, 4, 5]}],
    }


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_json_non_finite_floats_round_trip(datatype):
    # tritonclient writes NaN and the infinities as Python's json does; Triton reads them, and
    # writes them back the same way (orjson alone would refuse them, and write null).
    values = np.array([[np.nan, np.inf], [-np.inf, 0.25]], datatypes.numpy_dtype(datatype))
    tensor = httpclient.InferInput("a", [2, 2], datatype)
    tensor.set_data_from_numpy(values, binary_data=False)
    body, header_length = client_body([tensor])
    assert b"NaN" in body and b"-Infinity" in body
    request, _ = decode(body, header_length)
    data = request.inputs[0].data
    response = InferResponse("m", "1", outputs=[OutputTensor("o", datatype, [2, 2], data)])
    chunks, _, _ = encode_infer_response(response, OutputFormat())
    assert b'"data":[NaN,Infinity,-Infinity,0.25]' in chunks[0]
    np.testing.assert_array_equal(parse(chunks, None).as_numpy("o"), values)


def test_empty_id_and_parameters_are_left_out():
    chunks, _, _ = encode_infer_response(InferResponse("m", "1"), OutputFormat())
    assert orjson.loads(chunks[0]) == {"model_name": "m", "model_version": "1", "outputs": []}


def test_mixed_outputs_follow_format():
    zero = OutputTensor("z", "FP32", [0], b"")
    shm = OutputTensor("s", "FP32", [4], b"")
    outs = [output("b", "FP32"), output("j", "INT8"), zero, shm, output("d", "BYTES")]
    fmt = OutputFormat(binary_default=True, binary={"j": False}, shared_memory={"s"})
    chunks, header_length, content_type = encode_infer_response(InferResponse("m", "1", outputs=outs), fmt)
    assert content_type == "application/octet-stream"
    assert chunks[1:] == [outs[0].data, outs[4].data]  # zero-size and shm outputs add no bytes
    header = orjson.loads(chunks[0])
    assert header["outputs"][2] == {"name": "z", "datatype": "FP32", "shape": [0],
                                    "parameters": {"binary_data_size": 0}}
    assert header["outputs"][3] == {"name": "s", "datatype": "FP32", "shape": [4]}
    result = parse(chunks, header_length)
    assert_same("FP32", result.as_numpy("b"), binary=True)
    assert_same("INT8", result.as_numpy("j"), binary=False)
    assert_same("BYTES", result.as_numpy("d"), binary=True)
    assert result.as_numpy("z").shape == (0,)


def test_only_zero_size_binary_outputs_send_no_header_length():
    response = InferResponse("m", "1", outputs=[OutputTensor("z", "INT64", [0, 2], b"")])
    chunks, header_length, content_type = encode_infer_response(response, OutputFormat(binary_default=True))
    assert (header_length, content_type) == (None, "application/json")
    assert parse(chunks, header_length).as_numpy("z").shape == (0, 2)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_output_is_rejected(datatype):
    response = InferResponse("m", "1", outputs=[output("o", datatype)])
    with pytest.raises(ServerError) as info:
        encode_infer_response(response, OutputFormat())
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message.startswith(f"sending {datatype} data via JSON is not supported")


def test_non_utf8_bytes_json_output_is_rejected():
    data = datatypes.serialize_bytes([b"\xff\xfe"])
    response = InferResponse("m", "1", outputs=[OutputTensor("o", "BYTES", [1], data)])
    with pytest.raises(ServerError) as info:
        encode_infer_response(response, OutputFormat())
    assert info.value.code is Code.INVALID_ARG and "binary_data=true" in info.value.message


@pytest.mark.parametrize("out", [
    OutputTensor("o", "FP32", [3], b"\x00" * 8),
    OutputTensor("o", "BYTES", [2], datatypes.serialize_bytes([b"a"])),
])
def test_json_output_size_mismatch_is_internal(out):
    with pytest.raises(ServerError) as info:
        encode_infer_response(InferResponse("m", "1", outputs=[out]), OutputFormat())
    assert info.value.code is Code.INTERNAL
    assert info.value.message == "output tensor shape does not match size of output for 'o'"


@pytest.mark.parametrize("datatype, message", [
    ("FP32", "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)"),
    ("BYTES", "JSON nesting depth exceeds maximum allowed limit (100)")])
def test_data_nested_100_deep_is_refused_with_tritons_words(datatype, message):
    data = "x" if datatype == "BYTES" else 1.0
    for _ in range(100):
        data = [data]
    with pytest.raises(ServerError) as e:
        json_input_bytes("I", datatype, [1] * 100, data)
    assert (e.value.code, e.value.message) == (Code.INVALID_ARG, message)
    if datatype == "BYTES":  # one level less passes (numpy stops FP32 at 64 dimensions)
        assert json_input_bytes("I", "BYTES", [1] * 99, data[0]) == b"\1\0\0\0x"
