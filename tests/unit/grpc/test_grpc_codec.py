"""gRPC infer codec against the messages tritonclient really builds and reads."""

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import serialize_byte_tensor

from shmserve import proto
from shmserve.errors import Code, ServerError
from shmserve.grpc import codec
from shmserve.grpc.codec import (
    decode_model_infer_request,
    parse_model_infer_request,
    read_model_infer_request,
    serialize_model_infer_response,
    serialize_stream_infer_response,
    parameters_from_proto,
    parameters_to_proto,
)
from shmserve.inference import InferResponse, OutputTensor

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
    "BYTES": np.array([[b"abc", b"", b"\xff\x00x"]], dtype=np.object_),
}
TYPED_FIELDS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
    "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def wire_bytes(datatype):
    array = SAMPLES[datatype]
    if datatype == "BYTES":
        return serialize_byte_tensor(array).item()
    return array.tobytes()


def make_input(name, datatype):
    tensor = grpcclient.InferInput(name, list(SAMPLES[datatype].shape), datatype)
    tensor.set_data_from_numpy(SAMPLES[datatype])
    return tensor


def client_request(inputs, outputs=None, request_id="", sequence_id=0, sequence_start=False,
                   sequence_end=False, priority=0, timeout=None, parameters=None):
    return _get_inference_request("m", inputs, "2", request_id, outputs, sequence_id,
                                  sequence_start, sequence_end, priority, timeout, parameters)


def decode(client_msg):
    """Over the wire: serialized by tritonclient's classes, parsed by ours."""
    return decode_model_infer_request(proto.ModelInferRequest.FromString(client_msg.SerializeToString()))


def invalid(client_msg):
    with pytest.raises(ServerError) as info:
        decode(client_msg)
    assert info.value.code is Code.INVALID_ARG
    return info.value.message


def typed_request(datatype, field, values, shape):
    msg = service_pb2.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return msg


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_raw_input_every_datatype(datatype):
    request = decode(client_request([make_input("x", datatype)]))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, list(SAMPLES[datatype].shape))
    assert bytes(tensor.data) == wire_bytes(datatype)
    assert tensor.parameters == {}


@pytest.mark.parametrize("datatype", list(TYPED_FIELDS))
def test_typed_contents_every_datatype(datatype):
    array = SAMPLES[datatype]
    values = array.reshape(-1).tolist()
    request = decode(typed_request(datatype, TYPED_FIELDS[datatype], values, list(array.shape)))
    assert bytes(request.inputs[0].data) == wire_bytes(datatype)


def test_empty_typed_contents_are_zero_bytes():
    msg = service_pb2.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="FP32", shape=[0]).contents.SetInParent()
    assert bytes(decode(msg).inputs[0].data) == b""


def test_shared_memory_inputs_take_no_raw_entry():
    shm = grpcclient.InferInput("s", [4], "FP32")
    shm.set_shared_memory("region", 16, offset=64)
    request = decode(client_request([make_input("a", "INT32"), shm, make_input("b", "BYTES")]))
    a, s, b = request.inputs
    assert bytes(a.data) == wire_bytes("INT32") and bytes(b.data) == wire_bytes("BYTES")
    assert s.data is None
    assert s.parameters == {"shared_memory_region": "region", "shared_memory_byte_size": 16,
                            "shared_memory_offset": 64}


def test_request_fields_and_parameters():
    outputs = [grpcclient.InferRequestedOutput("o"), grpcclient.InferRequestedOutput("c", class_count=2)]
    shm_out = grpcclient.InferRequestedOutput("s")
    shm_out.set_shared_memory("out", 32)
    msg = client_request(
        [make_input("a", "FP32")], outputs=outputs + [shm_out], request_id="r9", sequence_id="corr",
        sequence_start=True, sequence_end=True, priority=5, timeout=100,
        parameters={"flag": False, "n": -3, "ratio": 0.25, "s": "v"},
    )
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    request = decode(msg)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r9")
    assert request.parameters == {
        "sequence_id": "corr", "sequence_start": True, "sequence_end": True, "priority": 5,
        "timeout": 100, "flag": False, "n": -3, "ratio": 0.25, "s": "v",
        "triton_enable_empty_final_response": True,
    }
    assert [(o.name, o.parameters) for o in request.outputs] == [
        ("o", {}), ("c", {"classification": 2}),
        ("s", {"shared_memory_region": "out", "shared_memory_byte_size": 32}),
    ]


# ---------------------------------------------------------------- decode errors


def test_reserved_triton_parameter():
    msg = client_request([make_input("a", "FP32")])
    msg.parameters["triton_other"].bool_param = True
    assert invalid(msg).startswith("parameter keys starting with 'triton_' are reserved")


def test_parameter_without_value():
    msg = client_request([make_input("a", "FP32")])
    msg.parameters["empty"].SetInParent()
    assert "'empty'" in invalid(msg)


def test_too_few_raw_entries():
    msg = client_request([make_input("a", "FP32"), make_input("b", "INT8")])
    del msg.raw_input_contents[1]
    assert invalid(msg) == "unable to find data for input tensor 'b' for model 'm' in request."


def test_too_many_raw_entries():
    msg = client_request([make_input("a", "FP32")])
    msg.raw_input_contents.append(b"\x00")
    assert invalid(msg) == (
        "expected 1 raw_input_contents entries (one per input not in shared memory) "
        "but got 2 for model 'm'"
    )


def test_raw_and_typed_contents_do_not_mix():
    msg = client_request([make_input("a", "FP32")])
    msg.inputs.add(name="b", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    assert invalid(msg) == (
        "contents field must not be specified when using raw_input_contents for 'b' for model 'm'"
    )


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_must_be_raw(datatype):
    message = invalid(typed_request(datatype, "fp32_contents", [1.0], [1]))
    assert message == (
        f"unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'FP32', "
        f"expected datatype '{datatype}'"
    )


def test_typed_contents_of_another_type():
    assert "of type 'INT64', expected datatype 'INT32'" in invalid(
        typed_request("INT32", "int64_contents", [1], [1]))


def test_two_typed_fields():
    msg = typed_request("FP32", "fp32_contents", [1.0], [1])
    msg.inputs[0].contents.fp64_contents.append(1.0)
    assert invalid(msg).endswith("binary data was already supplied.")


def test_shared_memory_input_with_contents():
    msg = typed_request("FP32", "fp32_contents", [1.0], [1])
    msg.inputs[0].parameters["shared_memory_region"].string_param = "r"
    assert invalid(msg).startswith("unexpected 'content' provided when using shared memory")


def test_shared_memory_parameter_types():
    msg = service_pb2.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].string_param = "4"
    assert "'shared_memory_byte_size'" in invalid(msg)
    tensor.parameters["shared_memory_byte_size"].uint64_param = 4
    assert invalid(msg) == ("invalid value type for 'shared_memory_byte_size' parameter for "
                            "tensor 'x', expected int64_param.")
    tensor.parameters["shared_memory_byte_size"].int64_param = 4
    tensor.parameters["shared_memory_region"].int64_param = 1
    assert "'shared_memory_region'" in invalid(msg)


def test_shared_memory_parameters_go_together():
    msg = service_pb2.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    assert invalid(msg) == ("'shared_memory_byte_size' must be specified along with "
                            "'shared_memory_region' parameter for tensor 'x'")
    del tensor.parameters["shared_memory_region"]
    tensor.parameters["shared_memory_offset"].int64_param = 0
    msg.raw_input_contents.append(bytes(4))
    assert invalid(msg) == ("'shared_memory_offset' can not be specified without "
                            "'shared_memory_region' parameter for tensor 'x'")
    del msg.inputs[:]
    del msg.raw_input_contents[:]
    msg.outputs.add(name="y").parameters["shared_memory_byte_size"].int64_param = 4
    assert invalid(msg) == ("'shared_memory_byte_size' can not be specified without "
                            "'shared_memory_region' parameter for tensor 'y'")


def test_unknown_datatype_and_negative_shape():
    msg = service_pb2.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="FP8", shape=[1])
    assert invalid(msg) == "invalid datatype 'FP8' for input 'x'"
    msg.inputs[0].datatype = "FP32"
    msg.inputs[0].shape[0] = -1
    assert invalid(msg) == "invalid shape [-1] for input 'x'"


# ---------------------------------------------------------------- encode


def reference(resp: InferResponse) -> service_pb2.ModelInferResponse:
    """The message as protobuf itself builds it, from its constructors."""
    def with_parameters(msg, parameters):
        parameters_to_proto(parameters or {}, msg.parameters)
        return msg

    tensors = [with_parameters(service_pb2.ModelInferResponse.InferOutputTensor(
        name=o.name, datatype=o.datatype, shape=o.shape), o.parameters) for o in resp.outputs]
    return with_parameters(service_pb2.ModelInferResponse(
        model_name=resp.model_name, model_version=resp.model_version, id=resp.id,
        outputs=tensors, raw_output_contents=[bytes(o.data) for o in resp.outputs]),
        resp.parameters)


def client_result(response):
    """Over the wire: serialized as ModelInfer sends it, parsed by tritonclient's classes."""
    wire = serialize_model_infer_response(response)
    assert wire == reference(response).SerializeToString()
    return grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(wire))


def test_large_outputs_serialize_as_protobuf_does():
    big = OutputTensor("big", "UINT8", [300_000], memoryview(bytes(range(256)) * 1172)[:300_000])
    response = InferResponse("m", "1", outputs=[big, output("b", "BYTES")])
    assert serialize_model_infer_response(response) == reference(response).SerializeToString()


@pytest.mark.parametrize("final", [False, True])
def test_stream_responses_parse_as_protobuf_builds_them(final):
    big = OutputTensor("big", "UINT8", [300_000], memoryview(bytes(range(256)) * 1172)[:300_000])
    response = InferResponse("m", "1", id="r", parameters={"n": 3},
                             outputs=[big, output("b", "BYTES")])
    got = service_pb2.ModelStreamInferResponse.FromString(
        serialize_stream_infer_response(response, final))
    want = service_pb2.ModelStreamInferResponse()
    want.infer_response.CopyFrom(reference(response))
    want.infer_response.parameters["triton_final_response"].bool_param = final
    assert got == want
    flag = got.infer_response.parameters["triton_final_response"]
    assert flag.WhichOneof("parameter_choice") == "bool_param" and flag.bool_param is final


def output(name, datatype, as_memoryview=False):
    data = wire_bytes(datatype)
    return OutputTensor(name, datatype, list(SAMPLES[datatype].shape),
                        memoryview(data) if as_memoryview else data)


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_output_every_datatype(datatype):
    result = client_result(InferResponse("m", "1", outputs=[output("o", datatype)]))
    got, want = result.as_numpy("o"), SAMPLES[datatype]
    assert got.shape == want.shape
    if datatype == "BF16":
        assert got.tobytes() == want.tobytes()
    else:
        np.testing.assert_array_equal(got, want)


def test_every_output_has_a_raw_entry_in_order():
    outs = [
        output("a", "FP32", as_memoryview=True),
        OutputTensor("zero", "INT32", [0, 4], b""),
        OutputTensor("in_shm", "FP32", [4], b""),
        output("b", "BYTES"),
    ]
    msg = service_pb2.ModelInferResponse.FromString(
        serialize_model_infer_response(InferResponse("m", "1", outputs=outs)))
    assert [bytes(c) for c in msg.raw_output_contents] == [bytes(o.data) for o in outs]
    result = client_result(InferResponse("m", "1", outputs=outs))
    np.testing.assert_array_equal(result.as_numpy("a"), SAMPLES["FP32"])
    np.testing.assert_array_equal(result.as_numpy("b"), SAMPLES["BYTES"])
    assert result.as_numpy("zero").shape == (0, 4)


def test_responses_to_repeated_requests_share_a_head():
    codec._HEADS.clear()
    for rows in (2, 2, 1):
        data = np.arange(rows * 3, dtype=np.float32)
        response = InferResponse("m", "1", id="r", outputs=[
            OutputTensor("o", "FP32", [rows, 3], memoryview(data).cast("B"))])
        assert service_pb2.ModelInferResponse.FromString(
            serialize_model_infer_response(response)) == reference(response)
    assert len(codec._HEADS) == 2


def test_response_fields_and_parameters():
    response = InferResponse("m", "4", id="r1", parameters={"triton_final_response": True, "n": 3},
                             outputs=[OutputTensor("o", "UINT8", [1], b"\x05", parameters={"k": "v"})])
    msg = service_pb2.ModelInferResponse.FromString(serialize_model_infer_response(response))
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "4", "r1")
    assert msg.parameters["triton_final_response"].bool_param is True
    assert msg.parameters["n"].int64_param == 3
    assert (msg.outputs[0].name, msg.outputs[0].datatype, list(msg.outputs[0].shape)) == ("o", "UINT8", [1])
    assert parameters_from_proto(msg.outputs[0].parameters) == {"k": "v"}


def test_parameters_round_trip():
    params = {"b": True, "i": -(2**63), "big": 2**64 - 1, "f": 1.5, "s": "x"}
    msg = proto.ModelInferResponse()
    parameters_to_proto(params, msg.parameters)
    assert msg.parameters["b"].WhichOneof("parameter_choice") == "bool_param"
    assert msg.parameters["i"].WhichOneof("parameter_choice") == "int64_param"
    assert msg.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"
    assert msg.parameters["f"].WhichOneof("parameter_choice") == "double_param"
    assert msg.parameters["s"].WhichOneof("parameter_choice") == "string_param"
    assert parameters_from_proto(msg.parameters) == params


@pytest.mark.parametrize("value", [b"bytes", [1], 2**64])
def test_parameters_of_unsupported_value(value):
    with pytest.raises(ServerError) as info:
        parameters_to_proto({"p": value}, proto.ModelInferResponse().parameters)
    assert info.value.code is Code.INTERNAL and "'p'" in info.value.message


def test_large_requests_keep_their_raw_inputs_in_place():
    msg = service_pb2.ModelInferRequest(model_name="m", id="x")
    msg.parameters["p"].int64_param = 3
    for name, size in (("a", 100_000), ("b", 5), ("c", 0)):
        msg.inputs.add(name=name, datatype="UINT8", shape=[size])
        msg.raw_input_contents.append(bytes([size % 251]) * size)
    wire = msg.SerializeToString()
    parsed, raw = parse_model_infer_request(wire)
    assert [type(r) for r in raw] == [memoryview] * 3
    assert [bytes(r) for r in raw] == list(msg.raw_input_contents)
    del msg.raw_input_contents[:]
    assert parsed.SerializeToString() == msg.SerializeToString()
    request = decode_model_infer_request(parsed, raw)
    assert [t.data.nbytes for t in request.inputs] == [100_000, 5, 0]
    small, none = parse_model_infer_request(service_pb2.ModelInferRequest(model_name="m")
                                            .SerializeToString())
    assert (small.model_name, none) == ("m", None)


def test_a_repeated_request_head_is_decoded_once():
    codec._TEMPLATES.clear()
    msg = client_request([make_input("a", "FP32"), make_input("b", "BYTES")],
                         [grpcclient.InferRequestedOutput("y")], request_id="7",
                         parameters={"p": 1})
    first = read_model_infer_request(msg.SerializeToString())
    assert len(codec._TEMPLATES) == 1
    msg.raw_input_contents[0] = bytes(24)
    second = read_model_infer_request(memoryview(bytearray(msg.SerializeToString())))
    assert len(codec._TEMPLATES) == 1
    assert [bytes(t.data) for t in second.inputs] == list(msg.raw_input_contents)
    assert bytes(first.inputs[0].data) == wire_bytes("FP32")
    assert (second.model_name, second.model_version, second.id, second.parameters) == (
        "m", "2", "7", {"p": 1})
    assert [(t.name, t.datatype, t.shape) for t in second.inputs] == [
        ("a", "FP32", [2, 3]), ("b", "BYTES", [1, 3])]
    assert [o.name for o in second.outputs] == ["y"]
    # Each request has its own parameters and shapes, which the server may change.
    first.parameters["q"] = 2
    first.inputs[0].shape[0] = 9
    third = read_model_infer_request(msg.SerializeToString())
    assert third.parameters == {"p": 1} and third.inputs[0].shape == [2, 3]


def assert_one_raw_entry_too_many_is_refused(msg):
    """With one more raw entry than its one input outside shared memory takes, `msg` is
    refused as a request seen the first time is."""
    msg.raw_input_contents.append(b"\x00")
    with pytest.raises(ServerError) as info:
        read_model_infer_request(msg.SerializeToString())
    assert info.value.message == (
        "expected 1 raw_input_contents entries (one per input not in shared memory) "
        "but got 2 for model 'm'")


def test_a_known_head_with_other_raw_entries_is_refused_as_before():
    codec._TEMPLATES.clear()
    msg = client_request([make_input("a", "FP32")])
    read_model_infer_request(msg.SerializeToString())
    assert_one_raw_entry_too_many_is_refused(msg)


def test_a_known_head_with_inputs_in_shared_memory_takes_raw_entries_for_the_others():
    codec._TEMPLATES.clear()
    msg = client_request([make_input("a", "FP32"), make_input("b", "INT8")])
    msg.inputs[0].parameters["shared_memory_region"].string_param = "r"
    msg.inputs[0].parameters["shared_memory_byte_size"].int64_param = 24
    del msg.raw_input_contents[0]
    for _ in range(2):
        request = read_model_infer_request(msg.SerializeToString())
        assert [t.data if t.data is None else bytes(t.data) for t in request.inputs] == [
            None, wire_bytes("INT8")]
    assert len(codec._TEMPLATES) == 1
    assert_one_raw_entry_too_many_is_refused(msg)


@pytest.mark.parametrize("count", [2, 5000])  # a head of 5000 values is not even looked up
def test_typed_contents_are_decoded_each_time(count):
    codec._TEMPLATES.clear()
    values = list(range(count))
    msg = typed_request("INT32", "int_contents", values, [count])
    for _ in range(2):
        request = read_model_infer_request(msg.SerializeToString())
        assert bytes(request.inputs[0].data) == np.array(values, np.int32).tobytes()
    assert not codec._TEMPLATES


def test_raw_entries_before_other_fields_are_parsed_whole():
    msg = client_request([make_input("a", "FP32")])
    wire = msg.SerializeToString()
    cut = wire.index(b"\x3a")
    reordered = wire[cut:] + wire[:cut]
    request = read_model_infer_request(reordered)
    assert bytes(request.inputs[0].data) == wire_bytes("FP32")


@pytest.mark.parametrize("wire", [b"\x0a\xff" + bytes(70_000), b"\x0a\xff\x01"])
def test_a_malformed_request_is_invalid(wire):
    with pytest.raises(ServerError) as info:
        parse_model_infer_request(wire)
    assert info.value.code is Code.INVALID_ARG


def test_a_prepared_message_is_the_serialized_one_around_its_outputs():
    """What the model's worker writes (see shmserve/fastpath/prepared_answers.py): the pieces
    with the outputs' bytes between them are the message this side would send."""
    outputs = [OutputTensor("A", "FP32", [2, 3], np.arange(6, dtype=np.float32).tobytes()),
               OutputTensor("B", "INT64", [300], memoryview(np.arange(300).tobytes()))]
    response = InferResponse("m", "2", "an-id", {}, outputs)
    pieces, size, expected = codec.prepared_message(response)
    assert expected == [["A", "FP32", [2, 3], 24], ["B", "INT64", [300], 2400]]
    joined = pieces[0] + bytes(outputs[0].data) + pieces[1] + bytes(outputs[1].data) + pieces[2]
    wire = serialize_model_infer_response(response)
    assert joined == wire and size == len(wire)


@pytest.mark.parametrize("response", [
    InferResponse("m", "1", "", {"p": 1}, [OutputTensor("A", "FP32", [1], b"1234")]),
    InferResponse("m", "1", "", {}, [OutputTensor("A", "FP32", [1], b"1234", {"q": 1})]),
    InferResponse("m", "1", "", {}, [OutputTensor("S", "BYTES", [1], b"\1\0\0\0x")]),
], ids=["parameters", "output-parameters", "bytes"])
def test_a_message_that_says_more_than_its_outputs_shapes_is_not_prepared(response):
    assert codec.prepared_message(response) is None
