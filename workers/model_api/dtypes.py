"""Datatypes: Triton's datatype numbers, numpy types and config type strings mapped to each
other, and the BYTES tensor encoding."""

import numpy as np

from shmserve.ipc import datatypes


# Wire datatype name <-> TRITONSERVER_DataType number.
_TYPE_NUMBERS = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5,
    "INT8": 6, "INT16": 7, "INT32": 8, "INT64": 9,
    "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}

_NUMPY_TYPES = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64,
    6: np.int8, 7: np.int16, 8: np.int32, 9: np.int64,
    10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}
_TRITON_TYPES = {np.dtype(t): n for n, t in _NUMPY_TYPES.items() if n != 13}

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type):
    """numpy type for a TRITONSERVER_DataType number; None for BF16 and unknown numbers."""
    return _NUMPY_TYPES.get(data_type)


def numpy_to_triton_type(data_type):
    """TRITONSERVER_DataType number for a numpy type or dtype; None when there is none."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return _TYPE_NUMBERS["BYTES"]
    return _TRITON_TYPES.get(dtype)


def serialize_byte_tensor(input_tensor):
    """BYTES wire encoding (4-byte little-endian length + bytes per element, C order).

    Returns None when the array is not an object or bytes array.
    """
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    return datatypes.serialize_bytes(input_tensor.flat)


def deserialize_bytes_tensor(encoded_tensor):
    """1-D object array of the bytes elements in a BYTES-encoded buffer."""
    values = datatypes.deserialize_bytes(encoded_tensor)
    # np.array(list_of_bytes) would guess a dtype; filling an object array keeps each element.
    array = np.empty(len(values), dtype=np.object_)
    array[:] = values
    return array
