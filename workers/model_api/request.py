"""Requests: those execute() is handed and those a model makes for BLS calls
(`InferenceRequest.exec`), with their preferred memory and trace, and the lookups of inputs
(`batched_input`, shmserve's own, takes one input of a whole batch)."""

import asyncio
import json

import numpy as np

from shmserve.ipc import datatypes
from shmserve.ipc.locations import InCallArena
from workers import cuda
from workers.backends.batch import batch_view
from workers.model_api.bls import _bls_response, _ResponseIterator
from workers.model_api.constants import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    MemoryType,
)
from workers.model_api.context import CONTEXT
from workers.model_api.errors import TritonModelException
from workers.model_api.parameters import _COMPACT, _parameters_dict
from workers.model_api.response import InferenceResponseSender
from workers.model_api.server import _server_call
from workers.model_api.tensor import Tensor


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
        if not CONTEXT.bls_allowed:
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
        calls = CONTEXT.server_calls
        arena = None if decoupled or calls is None else calls.arena
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
                            data = InCallArena(offset, len(data))
                elif arena is not None and array.nbytes > arena.threshold \
                        and (offset := arena.put(array)) is not None:
                    blocks.append(offset)
                    data = InCallArena(offset, array.nbytes)
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
