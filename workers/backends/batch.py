"""The batch a backend runs and what it answers: the types between the worker loop and every
backend, and the conversions from wire bytes to arrays that backends share.

The loop hands a backend requests whose inputs are raw wire bytes (views of shared memory,
or of the frame for small tensors) and gets back responses whose outputs are numpy arrays in
wire layout, plus the compute timings Triton reports. The inputs of a batch lie in one block,
each input's tensors back to back in request order, so that a batching backend can take one
input of the whole batch as a single [N, ...] array without a copy (`batch_view`).
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from shmserve.ipc import datatypes
from shmserve.ipc.locations import InRegion
from workers import cuda


@dataclass(slots=True)
class Input:
    name: str
    datatype: str
    shape: list[int]
    # Wire bytes: little-endian; BYTES length-prefixed; BF16 raw. A cupy uint8 array when the
    # input is a view of a client's CUDA region.
    buffer: memoryview | bytes
    # Where it lies when `buffer` is a view of a system shared-memory region.
    origin: InRegion | None = None


def _never_cancelled() -> bool:
    return False


@dataclass(slots=True)
class Request:
    request_id: str
    correlation_id: int | str
    flags: int
    parameters: dict
    inputs: list[Input]
    requested_output_names: list[str]
    is_cancelled: Callable[[], bool] = _never_cancelled
    # A decoupled model's way out: respond(Response or None, final), from any thread.
    respond: Callable[["Response | None", bool], None] | None = None
    # A sequence model's request: its sequence's batch slot, and False for a null request
    # (a slot without a request in a batch), which the model sees with READY false.
    sequence_slot: int = -1
    ready: bool = True
    trace_id: int = 0  # the front's trace of the request, 0 when it is not traced
    trace_context: str = ""  # its OpenTelemetry context, in that trace mode
    timeout_us: int = 0  # the request's timeout, as `request.timeout()` gives it
    # Set by execute: an iterative-sequence model asked to run the request again
    # (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE); it has no response, or no final one, yet.
    rescheduled: bool = False


@dataclass(slots=True)
class Output:
    name: str
    datatype: str
    shape: list[int]
    # C-contiguous; BYTES: object array; BF16: uint16 array. A cupy array for a GPU tensor,
    # which is written device to device when its client region is on the GPU.
    array: np.ndarray


@dataclass(slots=True)
class Response:
    outputs: list[Output]
    error: tuple[str, str] | None  # (Triton error code name, message)
    parameters: dict
    answered: bool = False  # the error is the model's own InferenceResponse (not a failure)


@dataclass(slots=True)
class Timings:
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    start_ns: int = 0  # time.perf_counter_ns() when the batch began


def error_response(code: str, message: str) -> Response:
    return Response(outputs=[], error=(code, message), parameters={})


def input_array(tensor: Input, request_id: str, model_name: str):
    """The array of an input's wire bytes: a zero-copy view (numpy, or cupy for a client's
    CUDA region), except for BYTES, whose elements become an object array of bytes.
    ValueError, in words a client can act on, when the bytes do not fit the shape."""
    if tensor.datatype == "BYTES" and tensor.origin is not None:
        # In a client's region, which only the worker reads: it checks the elements, in
        # Triton's words (the front checks those a request carries).
        count = datatypes.element_count(tensor.shape)
        try:
            datatypes.check_bytes(tensor.buffer, count)
        except datatypes.BytesLayoutError as exc:
            message = exc.describe(tensor.name, model_name, count)
            if exc.problem != "data":
                message = f"[request id: {request_id or '<id_unknown>'}] {message}"
            raise ValueError(message) from None
    try:
        if cuda.is_device_array(tensor.buffer):
            dtype = datatypes.numpy_dtype(tensor.datatype)
            return tensor.buffer.view(dtype).reshape(tensor.shape)
        if tensor.datatype == "BYTES":
            count = datatypes.element_count(tensor.shape)
            array = np.empty(count, dtype=np.object_)
            array[:] = datatypes.deserialize_bytes(tensor.buffer, count)
            return array.reshape(tensor.shape)
        # np.ndarray over the buffer costs a third of frombuffer and reshape, but takes a
        # buffer longer than the shape needs: the length is checked here instead.
        buffer = tensor.buffer
        array = np.ndarray(tensor.shape, datatypes.numpy_dtype(tensor.datatype), buffer)
        if array.nbytes != len(buffer):
            raise ValueError(f"{len(buffer)} bytes for {array.nbytes}")
        return array
    except (ValueError, TypeError, KeyError, MemoryError) as exc:
        raise ValueError(
            f"input '{tensor.name}' ({tensor.datatype}, shape {tensor.shape}) does not match "
            f"its bytes: {exc}"
        ) from None


def batch_view(arrays):
    """One array over `arrays` when they lie back to back in one buffer, in order, with one
    dtype and row shape (as the inputs of a batch do in the block the server hands the
    worker); else None."""
    first = arrays[0]
    if first.ndim == 0 or first.dtype.hasobject or not first.flags.c_contiguous:
        return None
    owner = _memory_owner(first)
    dtype, row = first.dtype, first.shape[1:]
    end = first.__array_interface__["data"][0] + first.nbytes
    rows = first.shape[0]
    for array in arrays[1:]:
        if (array.dtype != dtype or array.shape[1:] != row or not array.flags.c_contiguous
                or array.__array_interface__["data"][0] != end
                or _memory_owner(array) is not owner):
            return None
        end += array.nbytes
        rows += array.shape[0]
    # Every piece lies inside the owner's memory and they touch, so the span does too. The
    # strides are spelled out: numpy may give a dimension of size 1 any stride.
    shape = (rows, *row)
    strides = []
    step = dtype.itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return np.lib.stride_tricks.as_strided(first, shape=shape, strides=strides[::-1])


def _memory_owner(array):
    """The object whose memory `array` views (the exporter behind a memoryview)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base
