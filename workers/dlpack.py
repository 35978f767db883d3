"""Reading and relabelling legacy DLPack capsules (name "dltensor") with ctypes.

numpy and cupy build and consume the capsules and own their memory; this module only reads a
capsule's device and element type and rewrites the element type in place. That is how BF16,
which has no numpy dtype, crosses DLPack: exported as uint16 storage relabelled kDLBfloat/16,
imported by relabelling kDLBfloat/16 to kDLUInt/16 before numpy or cupy takes the capsule.
"""

import ctypes

# DLDeviceType
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3

# DLDataTypeCode
KDL_INT = 0
KDL_UINT = 1
KDL_FLOAT = 2
KDL_BFLOAT = 4
KDL_BOOL = 6

_CAPSULE_NAME = b"dltensor"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    # DLManagedTensor starts with its DLTensor, so a capsule's pointer is also a DLTensor*.
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"


def _tensor(capsule) -> _DLTensor:
    if not _capsule_is_valid(capsule, _CAPSULE_NAME):
        raise ValueError("expected an unconsumed DLPack capsule named 'dltensor'")
    return _DLTensor.from_address(_capsule_pointer(capsule, _CAPSULE_NAME))


def device(capsule) -> tuple[int, int]:
    """(DLDeviceType, device id) of the tensor in the capsule."""
    dev = _tensor(capsule).device
    return dev.device_type, dev.device_id


def dtype(capsule) -> tuple[int, int, int]:
    """(type code, bits, lanes) of the tensor in the capsule."""
    dt = _tensor(capsule).dtype
    return dt.code, dt.bits, dt.lanes


def set_dtype(capsule, code: int, bits: int) -> None:
    """Relabel the element type of a capsule not yet handed to a consumer."""
    dt = _tensor(capsule).dtype
    dt.code = code
    dt.bits = bits


class CapsuleExporter:
    """Hands an existing capsule to np.from_dlpack / cupy.from_dlpack, which take objects only."""

    def __init__(self, capsule, device: tuple[int, int]):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, **_consumer_options):
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device
