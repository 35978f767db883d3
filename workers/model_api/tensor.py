"""Tensor: a named array in wire layout (numpy, or cupy on a GPU), with DLPack export and
import, BF16 included."""

import numpy as np

from shmserve.ipc import datatypes
from shmserve.ipc.locations import InRegion
from workers import cuda, dlpack
from workers.model_api.dtypes import _TYPE_NUMBERS
from workers.model_api.errors import TritonModelException


def _check_tensor_name(name):
    if not isinstance(name, str):
        raise TypeError(f"Tensor name must be a str, found {type(name)}")
    if name == "":
        raise TritonModelException("Tensor name cannot be an empty string.")


# Fast path for the fixed-size numpy dtypes (wire_from_numpy scans a table).
_WIRE_TYPES = {
    datatypes.numpy_dtype(name): name
    for name in datatypes.WIRE_TYPES
    if name not in ("BF16", "BYTES")
}


def _datatype_of(dtype: np.dtype) -> str:
    datatype = _WIRE_TYPES.get(dtype)
    if datatype is not None:
        return datatype
    try:
        return datatypes.wire_from_numpy(dtype)
    except ValueError:
        raise TritonModelException(
            f"numpy dtype {dtype} is not supported by Python backend tensors"
        ) from None


class Tensor:
    # _origin: the InRegion of a request's input that is a view of a shared-memory region, so
    # that a BLS call can pass it on by reference; None otherwise.
    __slots__ = ("_name", "_array", "_datatype", "_device_id", "_origin")

    def __init__(self, name, numpy_array):
        if numpy_array is None:
            raise TypeError("Tensor needs a numpy array, found None")
        _check_tensor_name(name)
        array = np.asarray(numpy_array)
        if array.dtype.kind in "SU":
            array = array.astype(np.object_)
        elif array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        datatype = _datatype_of(array.dtype)
        # Triton makes tensors C-contiguous on construction: DLPack export and the wire need it.
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._datatype = datatype
        self._device_id = None
        self._origin = None

    @classmethod
    def _wrap(cls, name: str, array, datatype: str, device_id: int | None = None,
              origin: InRegion | None = None) -> "Tensor":
        """A tensor over an array already in wire layout (no checks, no copy): the backend's path."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        tensor._device_id = device_id
        tensor._origin = origin
        return tensor

    def name(self):
        return self._name

    def as_numpy(self):
        if self._device_id is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and "
                "from_dlpack() instead."
            )
        return self._array

    def shape(self):
        return list(self._array.shape)

    def triton_dtype(self):
        return _TYPE_NUMBERS[self._datatype]

    def is_cpu(self):
        return self._device_id is None

    def to_dlpack(self):
        return self._capsule(None)

    def __dlpack__(self, stream=None):
        return self._capsule(stream)

    def __dlpack_device__(self):
        if self._device_id is None:
            return (dlpack.KDL_CPU, 0)
        return (dlpack.KDL_CUDA, self._device_id)

    def _capsule(self, stream):
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        array = self._array
        if self._device_id is not None:
            capsule = array.__dlpack__(stream=stream)
        else:
            if not array.flags.writeable:
                # Legacy DLPack cannot mark memory read-only, so numpy refuses to export it.
                array = array.copy()
            capsule = array.__dlpack__()
        if self._datatype == "BF16":
            dlpack.set_dtype(capsule, dlpack.KDL_BFLOAT, 16)
        return capsule

    @staticmethod
    def from_dlpack(name, dlpack_tensor):
        """A tensor sharing the memory of a DLPack capsule or of an object with __dlpack__."""
        _check_tensor_name(name)
        capsule = _capsule_of(dlpack_tensor)
        device_type, device_id = dlpack.device(capsule)
        bf16 = dlpack.dtype(capsule) == (dlpack.KDL_BFLOAT, 16, 1)
        if bf16:
            dlpack.set_dtype(capsule, dlpack.KDL_UINT, 16)
        exporter = dlpack.CapsuleExporter(capsule, (device_type, device_id))
        if device_type == dlpack.KDL_CUDA:
            array = cuda.from_dlpack(exporter)
        else:
            array = np.from_dlpack(exporter)
            device_id = None
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
                "in C-Order are supported."
            )
        datatype = "BF16" if bf16 else _datatype_of(array.dtype)
        return Tensor._wrap(name, array, datatype, device_id)


def _capsule_of(obj):
    """The capsule for Tensor.from_dlpack; a producer is asked for one on the consumer's stream."""
    if dlpack.is_capsule(obj):
        device_type, device_id = dlpack.device(obj)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type, device_id = obj.__dlpack_device__()
    else:
        raise TritonModelException(
            "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
            "`__dlpack__` and `__dlpack_device__` attributes"
        )
    if device_type not in (dlpack.KDL_CPU, dlpack.KDL_CUDA_HOST, dlpack.KDL_CUDA):
        raise TritonModelException(
            f"DLDevice type {int(device_type)} is not support by Python backend."
        )
    if device_type == dlpack.KDL_CUDA and not cuda.available():
        raise TritonModelException(
            "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not "
            "available"
        )
    if dlpack.is_capsule(obj):
        return obj
    if device_type == dlpack.KDL_CUDA:
        return obj.__dlpack__(stream=cuda.consumer_stream(device_id))
    return obj.__dlpack__(stream=None)
