"""A ModelConfig as JSON, exactly as Triton's /config endpoint renders it.

Proto field names in declaration order; every field without presence (scalars, repeated
fields, maps) printed even when default; message and oneof fields only when set; enums by
name; 64-bit integers as JSON numbers. protobuf's own MessageToDict prints 64-bit integers as
strings and lists set fields first, hence this walk over the descriptors.
"""

import math
import struct

from google.protobuf.descriptor import FieldDescriptor

from shmserve.proto import ModelConfig

_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_ENUM = FieldDescriptor.TYPE_ENUM
_FLOAT = FieldDescriptor.TYPE_FLOAT
_DOUBLE = FieldDescriptor.TYPE_DOUBLE


def config_to_json(config: ModelConfig) -> dict:
    """The config as a JSON-serializable dict."""
    return _message(config)


def _message(message) -> dict:
    rendered: dict[str, object] = {}
    for field in message.DESCRIPTOR.fields:
        if field.has_presence and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            rendered[field.name] = {str(key): _value(value_field, value[key])
                                    for key in sorted(value)}
        elif field.is_repeated:
            rendered[field.name] = [_value(field, item) for item in value]
        else:
            rendered[field.name] = _value(field, value)
    return rendered


def _value(field, value):
    if field.type == _MESSAGE:
        return _message(value)
    if field.type == _ENUM:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type == _FLOAT:
        return _json_number(_shortest_float32(value))
    if field.type == _DOUBLE:
        return _json_number(value)
    return value


def _shortest_float32(value: float) -> float:
    # A float field holds a float32: print 0.1, not its float64 widening 0.10000000149011612.
    if not math.isfinite(value):
        return value
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", candidate))[0] == value:
            return candidate
    return value


def _json_number(value: float):
    # JSON has no NaN or infinities; protobuf's JSON mapping spells them as strings.
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    # Triton prints a whole float as an integer (0, not 0.0), as protobuf's JSON printer
    # writes it and its JSON parser then reads it.
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value
