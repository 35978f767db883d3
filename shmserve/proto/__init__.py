"""Protocol messages: Triton's gRPC inference service, its model configuration, gRPC health.

The classes are built at import from the descriptor set that `python protos/generate.py`
writes, inside a private descriptor pool: tritonclient registers the same `inference.*` names
in protobuf's default pool, and one process may well import both.

Every top-level message of package `inference` is an attribute of this module
(`shmserve.proto.ModelInferRequest`, `shmserve.proto.ModelConfig`, ...), as are
`HealthCheckRequest` and `HealthCheckResponse`. Nested enum values are class attributes
(`ModelInstanceGroup.KIND_GPU`); the top-level enum is `DataType` (`DataType.Value("TYPE_FP32")`).
"""

from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from shmserve.proto._descriptors import DESCRIPTOR_SET

SERVICE_NAME = "inference.GRPCInferenceService"
HEALTH_SERVICE_NAME = "grpc.health.v1.Health"

POOL = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET).file:
    POOL.Add(_file)
del _file


def _message_class(descriptor) -> type:
    # GetMessageClass caches per descriptor, so every caller gets the same class.
    return message_factory.GetMessageClass(descriptor)


def _inference_messages() -> dict[str, type]:
    classes = {}
    for file_name in ("model_config.proto", "grpc_service.proto"):
        for name, descriptor in POOL.FindFileByName(file_name).message_types_by_name.items():
            classes[name] = _message_class(descriptor)
    return classes


_MESSAGES = _inference_messages()
globals().update(_MESSAGES)

if TYPE_CHECKING:
    # To mypy, the classes globals().update made are unknown names: it sees them through this
    # hook, as classes whose fields it cannot know (there are no generated stubs to tell it).
    def __getattr__(name: str) -> Any: ...

HealthCheckRequest = _message_class(POOL.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest"))
HealthCheckResponse = _message_class(
    POOL.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse"))
DataType = EnumTypeWrapper(POOL.FindEnumTypeByName("inference.DataType"))


def methods(service_full_name: str) -> list[tuple[str, type, type, bool, bool]]:
    """(method name, request class, response class, client streaming, server streaming) of
    every method of a service in POOL, in declaration order."""
    service = POOL.FindServiceByName(service_full_name)
    return [(m.name, _message_class(m.input_type), _message_class(m.output_type),
             m.client_streaming, m.server_streaming) for m in service.methods]


def enum_value(enum_full_name: str, name: str) -> int:
    """Number of a value, e.g. enum_value("inference.ModelInstanceGroup.Kind", "KIND_GPU").
    Raises KeyError for an unknown name."""
    return POOL.FindEnumTypeByName(enum_full_name).values_by_name[name].number


__all__ = sorted(_MESSAGES) + [
    "DataType", "HEALTH_SERVICE_NAME", "HealthCheckRequest", "HealthCheckResponse", "POOL",
    "SERVICE_NAME", "enum_value", "methods"]
