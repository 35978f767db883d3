"""The answers of BLS calls: InferenceResponses made from the server's replies (for a decoupled
call, the iterator over them), outputs copied to where the caller's PreferredMemory asks."""

import asyncio

import numpy as np

from shmserve.ipc import datatypes
from workers import cuda
from workers.model_api.errors import TritonError, _ErrorCode
from workers.model_api.response import InferenceResponse
from workers.model_api.tensor import Tensor


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
