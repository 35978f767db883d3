"""The worker's frame loop: frames in, frames out. Knows no models (that is runner.py).

A batch's inputs arrive as one block, inline or in a slot of the input arena; each input is a
slice of it, which the model sees as a zero-copy view. Outputs above the inline threshold are
written into the output arena, whose slots this side allocates and the front hands back with
`Release` once it has copied them out.
"""

import logging

import numpy as np

from shmserve.ipc import datatypes, messages
from shmserve.ipc.allocator import ArenaAllocator
from shmserve.ipc.shm import Segment
from workers.runner import RunnerInput, RunnerRequest

log = logging.getLogger("shmserve.worker")


class WorkerLoop:
    def __init__(self, channel, runner, init: messages.Init):
        self._channel = channel
        self._runner = runner
        self._inline_threshold = init.inline_threshold
        self._input_arena = Segment.attach(init.input_arena)
        self._output_arena = Segment.attach(init.output_arena)
        self._output_alloc = ArenaAllocator(self._output_arena.size)
        self._output_buf = self._output_arena.buffer

    def run(self) -> None:
        """Serve frames until Shutdown or until the front goes away."""
        try:
            while True:
                msg = self._channel.recv()
                if msg is None:
                    return  # the front is gone: nothing left to answer
                if isinstance(msg, messages.Execute):
                    self._execute(msg)
                elif isinstance(msg, messages.Release):
                    for offset in msg.offsets:
                        self._output_alloc.free(offset)
                elif isinstance(msg, messages.Shutdown):
                    try:
                        self._runner.finalize()
                    except Exception:
                        log.exception("finalize() failed")
                    finally:
                        self._channel.send(messages.Bye())
                    return
                else:
                    raise ValueError(f"unexpected frame {type(msg).__name__}")
        finally:
            self._input_arena.close()
            self._output_arena.close()

    def _input_block(self, location) -> memoryview:
        if isinstance(location, bytes):
            return memoryview(location)  # slices of a memoryview are views, of bytes copies
        _, offset, nbytes = location
        return self._input_arena.view(offset, nbytes)

    def _execute(self, msg: messages.Execute) -> None:
        block = self._input_block(msg.input_block)
        requests = [
            RunnerRequest(
                request_id=r.request_id,
                correlation_id=r.correlation_id,
                flags=r.flags,
                parameters=r.parameters,
                inputs=[_runner_input(t, block) for t in r.inputs],
                requested_output_names=r.requested_outputs,
            )
            for r in msg.requests
        ]
        responses, timings = self._runner.execute(requests)
        # The model may keep no reference to its inputs past execute (as in Triton), so the
        # views are dropped here and the front may reuse the input slot.
        del requests, block
        frames = []
        for resp in responses:
            if resp.error is not None:
                frames.append(messages.ResponseFrame(list(resp.error), [], resp.parameters))
                continue
            outputs = [messages.TensorRef(o.name, o.datatype, list(o.shape), self._place(o))
                       for o in resp.outputs]
            frames.append(messages.ResponseFrame(None, outputs, resp.parameters))
        self._channel.send(messages.Result(msg.batch_id, frames, timings.compute_input_ns,
                                           timings.compute_infer_ns, timings.compute_output_ns))

    def _place(self, out):
        """Inline bytes for small outputs, else a slot in the output arena."""
        arr = out.array
        if out.datatype == "BYTES":
            data = datatypes.serialize_bytes(arr.reshape(-1))
            nbytes = len(data)
        else:
            data = None
            nbytes = arr.nbytes
        if nbytes <= self._inline_threshold:
            return data if data is not None else _raw(arr)
        offset = self._output_alloc.alloc(nbytes)
        if offset is None:  # arena full: correctness over speed
            return data if data is not None else _raw(arr)
        dst = self._output_buf[offset:offset + nbytes]
        if data is not None:
            dst[:] = data
        else:
            np.copyto(np.frombuffer(dst, dtype=arr.dtype).reshape(arr.shape), arr)
        return (messages.OUTPUT_ARENA, offset, nbytes)


def _runner_input(ref: messages.TensorRef, block: memoryview) -> RunnerInput:
    offset, nbytes = ref.location
    return RunnerInput(ref.name, ref.datatype, ref.shape, block[offset:offset + nbytes])


def _raw(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without copying them (msgpack copies once)."""
    return arr.reshape(-1).view(np.uint8).data
