"""shmserve's `triton_python_backend_utils` (imported by models as `pb_utils`).

The API of Triton's Python backend module of the same name, written for shmserve: our Python
backend puts this module in `sys.modules` under that name before it imports a model, so
`model.py` files written for Triton run unchanged. Names, signatures, constants and error texts follow Triton.
One addition is shmserve's own: `batched_input`, a zero-copy [N, ...] view of an input over a
batch of requests.

Tensors hold a numpy array (or a cupy array for GPU tensors made with `Tensor.from_dlpack`).
BYTES tensors hold object arrays of bytes; BF16 tensors hold their bits as uint16 storage.
The Python backend (workers/backends/python.py) is the backend side of these classes and reads
their underscore attributes directly.
"""

import asyncio
import bisect
import copy
import enum
import json
import logging
import threading
import time

import numpy as np

from shmserve.ipc import datatypes
from workers import cuda, dlpack
from workers.backends.batch import batch_view

# Triton hands parameters() to the model as compact JSON: {"k":"v","n":7}.
_COMPACT = (",", ":")

# --- constants --------------------------------------------------------------------------------

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU

# --- type maps --------------------------------------------------------------------------------

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


# --- errors -----------------------------------------------------------------------------------


class TritonModelException(Exception):
    """The exception type models raise; also raised by this module for misuse."""


class _ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    # Printed as the Python backend's pybind enum prints its codes.
    def __str__(self):
        return f"__ErrorCode.{self.name}"

    def __format__(self, spec):
        return format(str(self), spec)

    def __repr__(self):
        return f"<__ErrorCode.{self.name}: {self.value}>"


class TritonError:
    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message, code=_ErrorCode.INTERNAL):
        if message is None:
            raise TypeError("TritonError message must not be None")
        self._message = str(message)
        self._code = _ErrorCode(code)

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r}, code={self._code.name})"


# --- tensors ----------------------------------------------------------------------------------


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
    # _origin: [region_id, offset, nbytes] of a request's input that is a view of a shared-
    # memory region, so that a BLS call can pass it on by reference; None otherwise.
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
              origin: list | None = None) -> "Tensor":
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


# --- requests and responses -------------------------------------------------------------------


def _parameters_dict(parameters) -> dict:
    """Validated copy of model-supplied parameters: str keys, bool/int/str values."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters)


class PreferredMemory:
    def __init__(self, preferred_memory_type, preferred_device_id=0):
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)


class InferenceTrace:
    """The trace of a request (`request.trace()`). A BLS request given it
    (`InferenceRequest(..., trace=request.trace())`) is traced as a child of the request's
    trace, if that request is traced."""

    def __init__(self, trace_id: int = 0, context: str = ""):
        self._trace_id = trace_id  # the front's trace id; 0: not traced
        self._context = context

    def get_context(self, mode="opentelemetry"):
        """The OpenTelemetry context of the request's model span as a JSON string
        (`{"traceparent": ...}`, for a propagator's `extract(json.loads(...))`), or None when
        the request is not traced or the server traces in the triton mode, as in Triton.
        `mode` is what later Triton releases take; only "opentelemetry" has a context."""
        if mode != "opentelemetry":
            return None
        return self._context or None


class InferenceResponseSender:
    """Sends responses for one request through a callback the worker side installs.

    `send(response, flags)` is checked as Triton checks it, then forwarded to
    `callback(response, flags)`; the sender closes after TRITONSERVER_RESPONSE_COMPLETE_FINAL.
    The callback decides what a response means (one final response for a non-decoupled model).
    """

    def __init__(self, callback, is_cancelled=None):
        self._callback = callback
        self._is_cancelled = is_cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to "
                "zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"send() expects an InferenceResponse, found {type(response)}")
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            self._callback(response, flags)
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True

    def is_cancelled(self):
        return self._is_cancelled is not None and self._is_cancelled()

    def _close(self) -> bool:
        """Close the sender; whether it was still open."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open


class InferenceRequest:
    def __init__(
        self,
        request_id="",
        correlation_id=0,
        inputs=None,
        requested_output_names=None,
        model_name=None,
        model_version=-1,
        flags=0,
        timeout=0,
        preferred_memory=None,
        trace=None,
        parameters=None,
    ):
        # The exception types are Triton's: pybind11's TypeError for an argument of the wrong
        # type, TritonModelException for what the stub itself checks.
        if inputs is None or requested_output_names is None or model_name is None:
            raise TypeError(
                "InferenceRequest needs inputs, requested_output_names and model_name"
            )
        for name, value, kind in (("request_id", request_id, str),
                                  ("model_name", model_name, (str, bytes)),
                                  ("model_version", model_version, int),
                                  ("flags", flags, int), ("timeout", timeout, int)):
            if not isinstance(value, kind):
                raise TypeError(f"InferenceRequest {name} has the wrong type: {type(value)}")
        if correlation_id is None:
            raise TypeError("InferenceRequest correlation_id cannot be None")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        for tensor in inputs:
            if tensor is None:
                raise TritonModelException("InferenceRequest inputs cannot hold None")
            if not isinstance(tensor, Tensor):
                raise TypeError(f"InferenceRequest inputs must be Tensors, found {type(tensor)}")
        for name in requested_output_names:
            if not isinstance(name, str):
                raise TypeError(f"requested_output_names must be strings, found {type(name)}")
        if isinstance(model_name, bytes):  # as read from a BYTES tensor: Triton takes it so
            model_name = model_name.decode()
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested_output_names = set(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory or PreferredMemory(TRITONSERVER_MEMORY_CPU)
        self._trace = trace or InferenceTrace()
        self._parameters = _parameters_dict(parameters)
        self._sender = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _incoming(
        cls,
        *,
        model_name: str,
        request_id: str,
        correlation_id,
        flags: int,
        timeout: int,
        parameters: dict,
        inputs: list,
        requested_output_names,
        sender: InferenceResponseSender,
        trace_id: int = 0,
        trace_context: str = "",
    ) -> "InferenceRequest":
        """A request handed to execute(): the backend's path, without the BLS argument checks."""
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = set(requested_output_names)
        request._model_name = model_name
        request._model_version = -1
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = None
        request._trace = InferenceTrace(trace_id, trace_context)
        # Client parameters pass through unchecked: they may hold types models cannot set.
        request._parameters = parameters
        request._sender = sender
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self):
        return self._inputs

    def requested_output_names(self):
        return self._requested_output_names

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        self._flags = flags

    def timeout(self):
        return self._timeout

    def parameters(self):
        return json.dumps(self._parameters, separators=_COMPACT)

    def trace(self):
        return self._trace

    def get_response_sender(self):
        if self._sender is None:
            raise TritonModelException(
                "Only requests passed to execute() have a response sender"
            )
        return self._sender

    def is_cancelled(self):
        return self._sender is not None and self._sender.is_cancelled()

    def set_release_flags(self, flags):
        self._release_flags = flags

    def exec(self, decoupled=False):
        """Run this request on the server (BLS): its InferenceResponse (with the error, if
        it failed), or with `decoupled=True` an iterator of the model's responses, the last
        one empty when the model sent its final flag alone (returned once the first has
        come, as Triton's)."""
        if not _bls_allowed:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        args, blocks = self._call_args(decoupled)
        replies = _server_call("infer", args, blocks)
        device = self._output_device()
        if decoupled:
            return _ResponseIterator(replies, device)
        try:
            return _bls_response(next(replies), device)
        finally:
            replies.close()

    def _output_device(self):
        """The GPU the caller's PreferredMemory asks outputs onto, or None for host memory
        (also where no GPU can be used: the outputs stay where the server can put them)."""
        preferred = self._preferred_memory
        if preferred is None or preferred.preferred_memory_type != TRITONSERVER_MEMORY_GPU:
            return None
        if not 0 <= preferred.preferred_device_id < cuda.device_count():
            return None
        return preferred.preferred_device_id

    async def async_exec(self, decoupled=False):
        """exec() from an async execute(): awaits the answer (a decoupled call's first
        response) without holding up the loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)

    def _call_args(self, decoupled: bool) -> tuple:
        """(the call's arguments, the CallArena blocks its inputs took). A request's input
        that is a view of a region goes on by reference. Other inputs of a decoupled call go
        inline: a caller may leave its responses while the target still reads them."""
        arena = None if decoupled or _server_calls is None else _server_calls.arena
        inputs = []
        blocks = []
        try:
            for tensor in self._inputs:
                array = tensor._array
                if tensor._origin is not None:
                    inputs.append([tensor._name, tensor._datatype, list(array.shape),
                                   tensor._origin])
                    continue
                if tensor._device_id is not None:
                    array = cuda.to_numpy(array)
                if tensor._datatype == "BYTES":
                    data = datatypes.serialize_bytes(array.reshape(-1))
                    if arena is not None and len(data) > arena.threshold:
                        offset = arena.put(np.frombuffer(data, np.uint8))
                        if offset is not None:
                            blocks.append(offset)
                            data = [offset, len(data)]
                elif arena is not None and array.nbytes > arena.threshold \
                        and (offset := arena.put(array)) is not None:
                    blocks.append(offset)
                    data = [offset, array.nbytes]
                else:
                    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
                inputs.append([tensor._name, tensor._datatype, list(array.shape), data])
        except BaseException:
            if blocks:
                arena.free(blocks)
            raise
        return {"model": self._model_name, "version": int(self._model_version),
                "id": self._request_id, "correlation_id": self._correlation_id,
                "flags": int(self._flags), "timeout": int(self._timeout),
                "parameters": self._parameters, "inputs": inputs,
                "outputs": sorted(self._requested_output_names), "decoupled": bool(decoupled),
                "trace": getattr(self._trace, "_trace_id", 0)}, blocks


_END = object()  # _ResponseIterator: no response after the last


class _ResponseIterator:
    """The responses of a decoupled BLS call, as Triton's ResponseIterator: made once the
    first has come; iterated with next() or `for` (each waits for its response), or with
    `async for` (waiting off the event loop); `cancel()` cancels the request, the responses
    still read to the final one."""

    def __init__(self, replies, device):
        self._replies = replies
        self._device = device
        self._first = self._read()

    def _read(self):
        reply = next(self._replies, None)
        return _END if reply is None else _bls_response(reply, self._device)

    def _take(self):
        item, self._first = self._first, None
        return self._read() if item is None else item

    def __iter__(self):
        return self

    def __next__(self):
        item = self._take()
        if item is _END:
            raise StopIteration
        return item

    def __aiter__(self):
        return self

    async def __anext__(self):
        item, self._first = self._first, None
        if item is None:
            item = await asyncio.get_running_loop().run_in_executor(None, self._read)
        if item is _END:
            raise StopAsyncIteration
        return item

    def cancel(self):
        """Asks the server to cancel the request (the model's is_cancelled() turns true);
        iterating goes on to the final response, as Triton's since 2.57."""
        self._replies.cancel()


def _bls_response(reply, device=None) -> "InferenceResponse":
    """`device`: the GPU its outputs go to (BYTES stay in host memory), or None."""
    frame = reply.response
    response = InferenceResponse()
    if frame is None:  # the final flag alone
        return response
    if frame.error is not None:
        code, message = frame.error
        response._error = TritonError(message, _ErrorCode.__members__.get(code,
                                                                          _ErrorCode.INTERNAL))
        return response
    response._output_tensors = [_bls_tensor(t, device) for t in frame.outputs]
    response._parameters = frame.parameters or {}
    return response


def _bls_tensor(ref, device=None) -> "Tensor":
    data = ref.location
    if device is not None and ref.datatype != "BYTES":
        array = np.frombuffer(data, dtype=datatypes.numpy_dtype(ref.datatype))
        return Tensor._wrap(ref.name, cuda.to_device(array.reshape(ref.shape), device),
                            ref.datatype, device)
    if ref.datatype == "BYTES":
        count = datatypes.element_count(ref.shape)
        array = np.empty(count, dtype=np.object_)
        array[:] = datatypes.deserialize_bytes(data, count)
        array = array.reshape(ref.shape)
    else:
        # A copy the model may write to, as it may write to its own inputs (outputs sent by
        # reference were copied out already).
        if type(data) is not bytearray:
            data = bytearray(data)
        array = np.frombuffer(data, dtype=datatypes.numpy_dtype(ref.datatype))
        array = array.reshape(ref.shape)
    return Tensor._wrap(ref.name, array, ref.datatype)


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None, parameters=None):
        if output_tensors is None:
            raise TypeError("output_tensors must be a list of Tensors, found None")
        tensors = list(output_tensors)
        for tensor in tensors:
            if tensor is None:
                raise TritonModelException("output_tensors cannot hold None")
            if not isinstance(tensor, Tensor):
                raise TypeError(f"output_tensors must hold Tensors, found {type(tensor)}")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"error must be a TritonError or None, found {type(error)}")
        self._output_tensors = tensors
        self._error = error
        self._parameters = _parameters_dict(parameters)

    def output_tensors(self):
        return self._output_tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return json.dumps(self._parameters, separators=_COMPACT)


def get_input_tensor_by_name(inference_request, name):
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def batched_input(requests, name):
    """Input `name` of all `requests` as one numpy array [N, ...], N the sum of their batch sizes.

    A shmserve extension, not part of Triton's pb_utils: a model that must also run on Triton
    can look it up with `getattr(pb_utils, "batched_input", None)` and concatenate itself when
    it is None. When the requests' tensors are consecutive row slices of one array, in request
    order (shmserve lays out the inputs of a batch that way for a model with max_batch_size >
    0), the result is a view of that array, without a copy; otherwise it is np.concatenate of
    each request's `as_numpy()`. Views of the server's input buffers are valid only during
    execute(), like the tensors themselves.
    """
    tensors = []
    for request in requests:
        tensor = get_input_tensor_by_name(request, name)
        if tensor is None:
            raise TritonModelException(
                f"batched_input: request '{request.request_id()}' has no input '{name}'"
            )
        tensors.append(tensor)
    if not tensors:
        raise TritonModelException(f"batched_input: no requests to batch input '{name}' of")
    arrays = [tensor.as_numpy() for tensor in tensors]
    if len(arrays) == 1:
        return arrays[0]
    view = batch_view(arrays)
    if view is not None:
        return view
    try:
        return np.concatenate(arrays)
    except ValueError as exc:
        raise TritonModelException(f"batched_input: cannot batch input '{name}': {exc}") from None


def get_output_tensor_by_name(inference_response, name):
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config, name):
    for entry in model_config.get("input", ()):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config, name):
    for entry in model_config.get("output", ()):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config):
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# --- model context (set by the Python backend) ------------------------------------------

_model_dir = ""
_instance_name = ""  # as Triton's stub names it in errors


def get_model_dir():
    """The folder holding the model's Python file (`<repository>/<model>/<version>`)."""
    return _model_dir


def _set_model_context(*, model_dir: str, instance_name: str = "") -> None:
    global _model_dir, _instance_name
    _model_dir = model_dir
    _instance_name = instance_name


_server_calls = None  # workers.server_calls.FrameReader of this worker


def _set_server_calls(reader) -> None:
    global _server_calls
    _server_calls = reader


# Whether the instance is past initialize() and not in finalize(): BLS calls are only made
# then, as in Triton (the backend says when).
_bls_allowed = False


def _allow_bls(allowed: bool) -> None:
    global _bls_allowed
    _bls_allowed = allowed


def _server_call(kind: str, args: dict, blocks=()):
    if _server_calls is None:
        raise TritonModelException("calls into the server work only inside a shmserve worker")
    return _server_calls.call(kind, args, blocks)


def _control(kind: str, args: dict):
    """A model-control call's answer; its error raised as TritonModelException."""
    replies = _server_call(kind, args)
    try:
        reply = next(replies)
    finally:
        replies.close()
    if reply.response is not None and reply.response.error is not None:
        raise TritonModelException(reply.response.error[1])
    return reply.value


def load_model(model_name, config="", files=None):
    """Load (or reload) a model of the repository, as the repository load API does: `config`
    a model configuration JSON string, `files` {"file:<version>/<name>": bytes}."""
    files = dict(files or {})
    for key, value in files.items():
        if not isinstance(key, str) or not key.startswith("file:"):
            raise TritonModelException(f"file keys must start with 'file:', got {key!r}")
        if not isinstance(value, (bytes, bytearray)):
            raise TritonModelException(f"the content of '{key}' must be bytes")
    _control("load", {"model": model_name, "config": config or "", "files": files})


def unload_model(model_name, unload_dependents=False):
    _control("unload", {"model": model_name, "unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name, model_version=""):
    return bool(_control("ready", {"model": model_name, "version": str(model_version)}))


# --- logging ----------------------------------------------------------------------------------

LOGGER_NAME = "shmserve.model"
_logger = logging.getLogger(LOGGER_NAME)


class Logger:
    """Model logging through the worker's logging setup (workers/__main__.py), which hands each
    record to the server log with its level; VERBOSE is logging.DEBUG, shown only while the
    server's verbose level is above 0."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LEVELS = {
        LogLevel.INFO: logging.INFO,
        LogLevel.WARNING: logging.WARNING,
        LogLevel.ERROR: logging.ERROR,
        LogLevel.VERBOSE: logging.DEBUG,
    }

    # A message must be a str and a level a LogLevel: pybind11's TypeError otherwise, as in
    # Triton.
    @staticmethod
    def log(message, level=LogLevel.INFO):
        if type(level) is not Logger.LogLevel:
            raise TypeError(f"the log level must be a Logger.LogLevel, found {type(level)}")
        _logger.log(Logger._LEVELS[level], _log_message(message), stacklevel=2)

    @staticmethod
    def log_info(message):
        _logger.info(_log_message(message), stacklevel=2)

    @staticmethod
    def log_warn(message):
        _logger.warning(_log_message(message), stacklevel=2)

    @staticmethod
    def log_error(message):
        _logger.error(_log_message(message), stacklevel=2)

    @staticmethod
    def log_verbose(message):
        _logger.debug(_log_message(message), stacklevel=2)


def _log_message(message) -> str:
    if not isinstance(message, str):
        raise TypeError(f"a log message must be a str, found {type(message)}")
    return message


# --- custom metrics ---------------------------------------------------------------------------
#
# Values live in this process; the front reads them when /metrics is scraped (see
# workers/metrics_report.py), so an update costs no message. Errors read as Triton's stub words
# them: its own checks plainly, its server's refusals behind the stub's prefix.


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_NAMES = ("COUNTER", "GAUGE", "HISTOGRAM")
_CLEARED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
            "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' "
            "objects have been deleted.")

# Every family name declared in this process. As in Triton's registry a name stays for good,
# with its first description and kind, while its series go with the last family object
# that made them.
_registry: dict = {}
_registry_lock = threading.Lock()
_metric_changes = 0  # bumped by every change a snapshot shows: unchanged values are not resent


def _refused(action: str, message: str) -> TritonModelException:
    """A refusal of Triton's server as its stub relays it: `action` is the stub's prefix."""
    return TritonModelException(f"{action}: Failed to process the request for model "
                                f"'{_instance_name}', message: {message}")


def _unsupported(kind: int, operation: str) -> str:
    return f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind]} does not support {operation}"


def _double(value) -> float:
    """`value` as the C++ double Triton's binding takes (a str is refused, not parsed)."""
    if type(value) is float:
        return value
    if isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"a metric value must be a number, found {type(value).__name__}")
    return float(value)


def _metrics_snapshot(since=None) -> tuple:
    """(changes so far, families), families None when nothing changed since the count
    `since`: [[name, description, kind, [[labels, value, updated], ...]], ...], families
    without series left out (Triton shows none); a histogram's value is [bucket bounds,
    counts per bucket and +Inf, sum, count]."""
    changes = _metric_changes  # read first: a change made while copying is sent next time too
    if changes == since:
        return changes, None
    out = []
    for family in list(_registry.values()):
        with family.lock:
            series = [[dict(s.labels), s.snapshot(), s.updated] for s in family.series.values()]
        if series:
            out.append([family.name, family.description, int(family.kind), series])
    return changes, out


def _changed() -> None:
    global _metric_changes
    _metric_changes += 1


class _Family:
    """One family name of this process, shared by every MetricFamily object of that name."""

    __slots__ = ("name", "description", "kind", "lock", "series")

    def __init__(self, name: str, description: str, kind: MetricKind):
        self.name = name
        self.description = description
        self.kind = kind
        # Reentrant: a MetricFamily collected by the GC inside a locked section takes it again.
        self.lock = threading.RLock()
        self.series: dict = {}  # sorted label items -> _Series


class _Series:
    """One labelled series; `users` counts the MetricFamily objects holding a Metric of it."""

    __slots__ = ("labels", "value", "updated", "bounds", "counts", "count", "users")

    def __init__(self, labels: dict, bounds):
        self.labels = labels
        self.value = 0.0  # a histogram's sum
        self.updated = time.monotonic()  # one clock for all processes: the newest gauge wins
        self.bounds = bounds
        self.counts = None if bounds is None else [0] * (len(bounds) + 1)  # last: +Inf
        self.count = 0
        self.users = 0

    def snapshot(self):
        if self.bounds is None:
            return self.value
        return [self.bounds, list(self.counts), self.value, self.count]


class Metric:
    """One labelled series of a MetricFamily. Unusable once that MetricFamily object is
    deleted, as in Triton."""

    __slots__ = ("_family", "_series")

    def __init__(self, family: _Family, series: _Series):
        self._family = family
        self._series = series  # None once cleared

    def increment(self, value):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to increment metric value: " + _CLEARED)
        value = _double(value)
        family = self._family
        if family.kind != MetricKind.GAUGE:
            if family.kind == MetricKind.HISTOGRAM:
                raise _refused("Failed to increment metric value",
                               _unsupported(MetricKind.HISTOGRAM, "Increment"))
            if value < 0.0:
                raise _refused("Failed to increment metric value",
                               "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                               "monotonically by non-negative values.")
        with family.lock:
            series.value += value
            series.updated = time.monotonic()
            _changed()

    def set(self, value):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to set metric value: " + _CLEARED)
        value = _double(value)
        family = self._family
        if family.kind != MetricKind.GAUGE:
            raise _refused("Failed to set metric value", _unsupported(family.kind, "Set"))
        with family.lock:
            series.value = value
            series.updated = time.monotonic()
            _changed()

    def observe(self, value):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to observe metric value: " + _CLEARED)
        value = _double(value)
        family = self._family
        if family.kind != MetricKind.HISTOGRAM:
            raise _refused("Failed to observe metric value", _unsupported(family.kind, "Observe"))
        with family.lock:
            series.counts[bisect.bisect_left(series.bounds, value)] += 1  # bounds are "le"
            series.count += 1
            series.value += value
            series.updated = time.monotonic()
            _changed()

    def value(self):
        series = self._series
        if series is None:
            raise TritonModelException("Failed to get metric value: " + _CLEARED)
        if self._family.kind == MetricKind.HISTOGRAM:
            raise _refused("Failed to get metric value",
                           _unsupported(MetricKind.HISTOGRAM, "Value"))
        return series.value


class MetricFamily:
    """A family of labelled series. Declaring a name again gives the same family (its first
    description stays); with another kind it is refused, server-wide as in Triton. Deleting
    this object clears the Metrics made through it, and a series goes with the last of them."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name, description, kind):
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        try:
            kind = MetricKind(kind)
        except ValueError:
            raise TypeError(f"MetricFamily(): unknown metric kind {kind!r}") from None
        with _registry_lock:
            family = _registry.get(name)
            if family is None:
                _declare_family(name, description, kind)
                family = _registry[name] = _Family(name, description, kind)
        if family.kind != kind:
            raise _refused("Error when creating MetricFamily",
                           "Family name already exists with different type")
        self._family = family
        self._metrics: dict = {}  # sorted label items -> the Metric made through this object

    def Metric(self, labels=None, buckets=None):  # noqa: N802 (Triton's name)
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        family = self._family
        bounds = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if family.kind != MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = [_double(b) for b in buckets]
        elif family.kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        labels = dict(labels or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TritonModelException("Metric labels must map str to str")
        key = tuple(sorted(labels.items()))
        metric = self._metrics.get(key)
        if metric is not None:  # same labels, same series: Triton's Metric objects share it
            return metric
        with family.lock:
            series = family.series.get(key)
            if series is None:
                # Triton checks the bounds of a new series only; an existing one keeps its own.
                if any(a >= b for a, b in zip(bounds or (), (bounds or ())[1:])):
                    raise _refused("Error when creating Metric",
                                   "Bucket Boundaries must be strictly sorted")
                series = family.series[key] = _Series(labels, bounds)
                _changed()  # a new series shows, at 0
            series.users += 1
            metric = self._metrics[key] = Metric(family, series)
        return metric

    def __del__(self):
        metrics = getattr(self, "_metrics", None)
        if not metrics:
            return
        family = self._family
        with family.lock:
            for key, metric in metrics.items():
                series, metric._series = metric._series, None
                series.users -= 1
                if not series.users and family.series.get(key) is series:
                    del family.series[key]
            _changed()


def _declare_family(name: str, description: str, kind: MetricKind) -> None:
    """Tell the front, which keeps the server's family names: another model's family of that
    name and another kind refuses this one. Outside a worker this process is the registry."""
    if _server_calls is None:
        return
    try:
        _control("metric_family", {"name": name, "description": description, "kind": int(kind)})
    except TritonModelException as exc:
        raise _refused("Error when creating MetricFamily", str(exc)) from None


# --- auto-complete ----------------------------------------------------------------------------


class ModelConfig:
    """The model configuration handed to auto_complete_config, with Triton's edit checks."""

    def __init__(self, model_config):
        if isinstance(model_config, str):
            self._model_config = json.loads(model_config)
        else:
            self._model_config = copy.deepcopy(model_config)

    def as_dict(self):
        return self._model_config

    def _name(self):
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size):
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input):  # noqa: A002 (Triton's parameter name)
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output):
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind, tensor, allowed):
        if not isinstance(tensor, dict):
            raise ValueError(f"{kind} must be a dict, found {type(tensor)}")
        model = self._name()
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing "
                "'name' property."
            )
        name = tensor["name"]
        extra = [key for key in tensor if key not in allowed]
        if extra:
            listed = ", ".join(f"'{key}'" for key in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(
                f"{kind} '{name}' in auto-complete-config function for model '{model}' "
                f"contains property other than {listed}."
            )
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model '{model}' is "
                    f"missing '{required}' property."
                )
        entries = self._model_config.setdefault(kind, [])
        for current in entries:
            if current["name"] != name:
                continue
            configured_type = current.get("data_type", "TYPE_INVALID")
            if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype "
                    f"{configured_type} for {kind} '{name}', model provides "
                    f"{tensor['data_type']}"
                )
            if current.get("dims") and current["dims"] != tensor["dims"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims "
                    f"{tensor['dims']} but the model configuration specifies dims "
                    f"{current['dims']}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        entries.append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict):
        model = self._name()
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                f"model transaction property in auto-complete-config function for model "
                f"'{model}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{model}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
