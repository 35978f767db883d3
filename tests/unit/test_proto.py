"""shmserve.proto against tritonclient's generated modules: same schema, same bytes."""

import os
import subprocess
import sys

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

import shmserve.proto as proto

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _field_shape(field) -> dict:
    referenced = field.message_type or field.enum_type
    return {
        "name": field.name,
        "number": field.number,
        "type": field.type,
        "repeated": field.is_repeated,
        "required": field.is_required,
        "referenced": referenced.full_name if referenced else None,
        "oneof": field.containing_oneof.name if field.containing_oneof else None,
        "map": bool(field.message_type and field.message_type.GetOptions().map_entry),
    }


def _enum_shape(enum) -> dict:
    return {"name": enum.full_name, "values": [(v.name, v.number) for v in enum.values]}


def _message_shape(message) -> dict:
    return {
        "name": message.full_name,
        "fields": [_field_shape(f) for f in message.fields],
        "oneofs": [o.name for o in message.oneofs],
        "enums": [_enum_shape(e) for e in message.enum_types],
        "nested": [_message_shape(m) for m in message.nested_types],
    }


def _file_pairs():
    for module in (model_config_pb2, service_pb2):
        yield module.DESCRIPTOR, proto.POOL.FindFileByName(module.DESCRIPTOR.name)


@pytest.mark.parametrize("theirs,ours", list(_file_pairs()), ids=lambda f: f.name)
def test_every_message_and_enum_matches_tritonclient(theirs, ours):
    assert ours.package == theirs.package == "inference"
    assert list(ours.message_types_by_name) == list(theirs.message_types_by_name)
    for name, message in theirs.message_types_by_name.items():
        assert _message_shape(ours.message_types_by_name[name]) == _message_shape(message)
    assert list(ours.enum_types_by_name) == list(theirs.enum_types_by_name)
    for name, enum in theirs.enum_types_by_name.items():
        assert _enum_shape(ours.enum_types_by_name[name]) == _enum_shape(enum)


def test_service_methods_match_tritonclient():
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    expected = [(m.name, m.input_type.full_name, m.output_type.full_name,
                 m.client_streaming, m.server_streaming) for m in theirs.methods]
    ours = [(name, req.DESCRIPTOR.full_name, resp.DESCRIPTOR.full_name, cs, ss)
            for name, req, resp, cs, ss in proto.methods(proto.SERVICE_NAME)]
    assert ours == expected
    assert ("ModelStreamInfer", "inference.ModelInferRequest",
            "inference.ModelStreamInferResponse", True, True) in ours


def test_module_exposes_every_inference_message():
    for module in (model_config_pb2, service_pb2):
        for name in module.DESCRIPTOR.message_types_by_name:
            assert getattr(proto, name).DESCRIPTOR.full_name == f"inference.{name}"


def test_health_service():
    assert proto.methods(proto.HEALTH_SERVICE_NAME) == [
        ("Check", proto.HealthCheckRequest, proto.HealthCheckResponse, False, False)]
    assert proto.HealthCheckRequest.DESCRIPTOR.full_name == "grpc.health.v1.HealthCheckRequest"
    assert proto.HealthCheckRequest(service="x").service == "x"
    assert [(v.name, v.number) for v in
            proto.HealthCheckResponse.DESCRIPTOR.enum_types_by_name["ServingStatus"].values] == [
        ("UNKNOWN", 0), ("SERVING", 1), ("NOT_SERVING", 2), ("SERVICE_UNKNOWN", 3)]
    assert proto.HealthCheckResponse(status=proto.HealthCheckResponse.SERVING).status == 1


def test_enum_helpers():
    assert proto.DataType.Value("TYPE_FP32") == 11
    assert proto.DataType.Name(13) == "TYPE_STRING"
    assert proto.enum_value("inference.ModelInstanceGroup.Kind", "KIND_GPU") == 1
    assert proto.ModelInstanceGroup.KIND_MODEL == 3
    with pytest.raises(KeyError):
        proto.enum_value("inference.DataType", "TYPE_NOPE")


def test_our_classes_are_not_in_the_default_pool():
    from google.protobuf import descriptor_pool
    assert proto.POOL is not descriptor_pool.Default()
    assert proto.ModelConfig.DESCRIPTOR is not model_config_pb2.ModelConfig.DESCRIPTOR


@pytest.mark.parametrize("first,second", [("tritonclient.grpc", "shmserve.proto"),
                                          ("shmserve.proto", "tritonclient.grpc")])
def test_imports_coexist_in_either_order(first, second):
    script = (
        f"import {first}, {second}\n"
        "import shmserve.proto as ours\n"
        "from tritonclient.grpc import service_pb2 as theirs\n"
        "data = ours.ModelInferRequest(model_name='m').SerializeToString()\n"
        "assert theirs.ModelInferRequest.FromString(data).model_name == 'm'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _fill_request(request):
    request.model_name = "add_sub"
    request.model_version = "1"
    request.id = "req-7"
    request.parameters["sequence_id"].int64_param = 42
    request.parameters["sequence_start"].bool_param = True
    request.parameters["priority"].uint64_param = 2**63 + 5
    request.parameters["custom"].string_param = "x"
    request.parameters["ratio"].double_param = 0.25
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    tensor.parameters["shared_memory_region"].string_param = "region"
    typed = request.inputs.add(name="INPUT1", datatype="INT32", shape=[2])
    typed.contents.int_contents.extend([-1, 7])
    output = request.outputs.add(name="OUTPUT0")
    output.parameters["classification"].int64_param = 3
    request.raw_input_contents.append(bytes(range(64)))
    return request


def _as_dict(message):
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def test_tritonclient_request_parses_with_ours_and_back():
    theirs = _fill_request(service_pb2.ModelInferRequest())
    ours = proto.ModelInferRequest.FromString(theirs.SerializeToString())
    assert _as_dict(ours) == _as_dict(theirs)
    assert ours.raw_input_contents[0] == bytes(range(64))
    assert ours.parameters["priority"].WhichOneof("parameter_choice") == "uint64_param"

    again = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert again == theirs


def test_our_response_parses_with_tritonclient():
    ours = proto.ModelStreamInferResponse(error_message="")
    response = ours.infer_response
    response.model_name = "m"
    response.parameters["triton_final_response"].bool_param = True
    response.outputs.add(name="OUT", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(b"\x03\x00\x00\x00abc")
    theirs = service_pb2.ModelStreamInferResponse.FromString(ours.SerializeToString())
    assert _as_dict(theirs) == _as_dict(ours)


def test_model_config_response_round_trips_with_tritonclient():
    theirs = service_pb2.ModelConfigResponse()
    config = theirs.config
    config.name = "m"
    config.backend = "python"
    config.max_batch_size = 8
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.dynamic_batching.priority_queue_policy[2].max_queue_size = 5
    config.input.add(name="IN", data_type=model_config_pb2.TYPE_FP32, dims=[-1, 3])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_GPU, gpus=[0, 1])
    config.parameters["EXECUTION_ENV_PATH"].string_value = "/env.tar.gz"
    config.version_policy.specific.versions.extend([1, 3])
    ours = proto.ModelConfigResponse.FromString(theirs.SerializeToString())
    assert _as_dict(ours) == _as_dict(theirs)
    assert ours.config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert service_pb2.ModelConfigResponse.FromString(ours.SerializeToString()) == theirs
