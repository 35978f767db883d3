"""The worker's frame loop: frames in, frames out. Knows no models: it runs batches on the
instance a backend loaded (workers/backends).

A batch's inputs arrive as one block, inline or in a slot of the input arena; each input is a
slice of it, which the model sees as a zero-copy view. Outputs above the inline threshold are
written into the output arena, whose slots this side allocates and the front hands back with
`Release` once it has copied them out. Inputs in a client's shared-memory region are views of
it, and outputs the client asked into its region are written there (see regions.py). A GPU
instance keeps the device outputs a request names in `device_outputs` on its GPU, for the next
instance to read there (see device_tensors.py).

A decoupled model's responses leave one `StreamResponse` at a time, from whatever thread sends
them. A request may have at most RESPONSE_WINDOW responses that the front has not yet handed
to its client: past that, the sender sleeps until half the window is free (the backpressure
of a slow reader; the front wakes it, see request_table.py), unless nobody reads the request
any more (abandoned: a client gone), whose responses are dropped here. A request whose caller
only asked to cancel it (a BLS cancel()) is still read, to its final response. Until its first response has been handed over, the window
is one response: a model that streams as fast as it can would otherwise take the CPU that the
first response needs to reach its client (time to first response matters most to a streaming
client). The window is small for the same reason: the front is what limits a stream's pace,
and a model running far ahead of it only takes a second core from the client reading it.

A sequence model's batch may hold null requests (a slot without a request, `ready` false):
they run like the others, but the front drops their answers, so they leave as empty
`ResponseFrame`s (a decoupled model's as a lone final flag). A request the model asked to run
again (an iterative sequence) is listed in `Result.rescheduled`, with an empty frame.
"""

import functools
import logging
import os
import threading
import time

import numpy as np

from shmserve.ipc import datatypes, messages
from shmserve.ipc.allocator import ArenaAllocator
from shmserve.ipc.idle_spin import MIN_IDLE_CORES, STREAM_MIN_IDLE_CORES
from shmserve.ipc.locations import InOutputArena, InRegion, OnDevice, WrittenToRegion
from shmserve.ipc.request_table import RequestTable
from shmserve.ipc.segments import Segment
from workers import cuda
from workers.prepared_answers import LentSockets, take_answers, write_answers
from workers.backends.batch import Input, Request, Response
from workers.device_tensors import DeviceInputs, KeptOutputs

log = logging.getLogger("shmserve.worker")

# The news that a batch's answers are written rides on the next batch's Result only when this
# batch, its writes included, took less than this: the front writes nothing of its own to
# those sockets until it knows, so it should not wait out a long batch.
CARRY_WRITTEN_BELOW_NS = 1_000_000
RESPONSE_WINDOW = 4
FIRST_WINDOW = 1
# A waiting sender looks at its row again after this long at most, should its wake be missed.
_WAIT_S = 0.002


class WorkerLoop:
    def __init__(self, channel, reader, instance, init: messages.Init, spin=None):
        """`channel` sends; `reader` (server_calls.FrameReader) receives; `instance`: the
        model instance its backend loaded. `spin`: the channel's IdleSpin, if it polls."""
        self._channel = channel
        self._spin = spin
        self._reader = reader
        self._instance = instance
        self._inline_threshold = init.inline_threshold
        self._input_arena = Segment.attach(init.input_arena)
        self._output_arena = Segment.attach(init.output_arena)
        self._output_alloc = ArenaAllocator(self._output_arena.size)
        # Decoupled models place outputs from their own threads too.
        self._output_lock = threading.Lock()
        self._output_buf = self._output_arena.buffer
        self._table = RequestTable(Segment.attach(init.request_table), init.wake_fd)
        self._carried = {}  # row -> _RowResponder of a rescheduled request of a decoupled model
        # Mapped and unmapped by whoever reads the frame saying so (see server_calls.py).
        self._regions = reader.regions
        self._kept = KeptOutputs()
        self._device_inputs = DeviceInputs(self._kept, self._regions)
        self._lent_sockets = LentSockets(init.loan_fd) if init.loan_fd >= 0 else None
        # [batch id, unsent] of written answers the front has not been told of (see Written).
        self._written = []

    def run(self) -> bool:
        """Serve frames until Shutdown (True) or until the front's end of the socket closes
        (False)."""
        try:
            while True:
                msg = self._reader.next_frame(self._tell_written if self._written else None)
                if msg is None:
                    return False  # the front is gone: nothing left to answer
                if isinstance(msg, messages.Execute):
                    self._execute(msg)
                elif isinstance(msg, messages.Release):
                    with self._output_lock:
                        for offset in msg.offsets:
                            self._output_alloc.free(offset)
                    if msg.kept:
                        self._kept.release(msg.kept)
                elif isinstance(msg, messages.CheckReady):
                    self._channel.send(messages.ReadyState(self._instance.is_ready()))
                elif isinstance(msg, messages.Shutdown):
                    self._tell_written()
                    try:
                        self._instance.finalize()
                    except Exception:
                        log.exception("finalize() failed")
                    finally:
                        self._channel.send(messages.Bye())
                    return True
                else:
                    raise ValueError(f"unexpected frame {type(msg).__name__}")
        finally:
            self._input_arena.close()
            self._output_arena.close()
            self._table.close()
            self._reader.close()
            if self._lent_sockets is not None:
                self._lent_sockets.close()

    def _tell_written(self) -> None:
        for batch_id, unsent in self._written:
            self._channel.send(messages.Written(batch_id, unsent))
        self._written = []

    def _input_block(self, location) -> memoryview:
        if isinstance(location, bytes):
            return memoryview(location)  # slices of a memoryview are views, of bytes copies
        return self._input_arena.view(location.offset, location.nbytes)

    def _execute(self, msg: messages.Execute) -> None:
        if self._spin is not None:
            # Polling after this batch is for its client's next request, when it waits alone.
            self._spin.min_idle_cores = STREAM_MIN_IDLE_CORES if msg.lone else MIN_IDLE_CORES
        # The batch's distinct client sockets, which the answers name by index.
        sockets = max((r.prepared_answer[0] + 1 for r in msg.requests
                       if r.prepared_answer is not None), default=0)
        client_fds = []
        if sockets and self._lent_sockets is not None:
            client_fds = self._lent_sockets.take(msg.batch_id, sockets)
        try:
            self._run_batch(msg, client_fds)
        finally:
            for fd in client_fds:
                os.close(fd)

    def _run_batch(self, msg: messages.Execute, client_fds: list) -> None:
        block = self._input_block(msg.input_block)
        table = self._table
        decoupled = self._instance.decoupled
        requests = []
        unreadable = {}  # index in the batch -> error response of a request whose region failed
        for r in msg.requests:
            try:
                inputs = [self._batch_input(t, block) for t in r.inputs]
            except ValueError as exc:
                inputs = []
                unreadable[len(requests)] = Response([], ("INVALID_ARG", str(exc)), {})
            targets = r.output_regions
            send = self._send_stream_response
            if targets or r.device_outputs:
                send = functools.partial(self._send_stream_response, targets=targets,
                                         on_device=r.device_outputs)
            respond = None
            if decoupled:
                if not r.ready:
                    respond = functools.partial(_final_only, send, r.row)
                else:
                    # A rescheduled request keeps its row, and the count of what it sent.
                    respond = self._carried.pop(r.row, None) or _RowResponder(table, r.row, send)
            requests.append(Request(
                request_id=r.request_id,
                correlation_id=r.correlation_id,
                flags=r.flags,
                parameters=r.parameters,
                inputs=inputs,
                requested_output_names=r.requested_outputs,
                is_cancelled=functools.partial(table.cancelled, r.row),
                respond=respond,
                sequence_slot=r.sequence_slot,
                ready=r.ready,
                trace_id=r.trace_id,
                trace_context=r.trace_context,
                timeout_us=r.timeout_us,
            ))
        runnable = [req for i, req in enumerate(requests) if i not in unreadable]
        responses, timings = self._instance.execute(runnable)
        if unreadable:
            if decoupled:
                for i, error in unreadable.items():
                    requests[i].respond(error, True)
            else:
                answered = iter(responses)
                responses = [unreadable[i] if i in unreadable else next(answered)
                             for i in range(len(requests))]
        rescheduled = ([i for i, req in enumerate(requests) if req.rescheduled]
                       if self._instance.iterative else [])
        if decoupled:
            for i in rescheduled:
                self._carried[msg.requests[i].row] = requests[i].respond
        # The model may keep no reference to its inputs past execute (as in Triton), so the
        # views are dropped here and the front may reuse the input slot.
        del requests, runnable, block
        self._device_inputs.close()
        placing = time.perf_counter_ns()
        answers = []
        written_by_worker = ()
        if client_fds:
            answers = take_answers(responses, msg.requests, client_fds,
                                   self._lent_sockets.backed_up, self._inline_threshold)
            written_by_worker = {i for _, taken in answers for i, _ in taken}
        # A null request's answer is dropped unread; a rescheduled request's is already empty.
        frames = [_WRITTEN_BY_WORKER if i in written_by_worker
                  else self._frame(resp, r.output_regions, r.device_outputs) if r.ready
                  else _unread_frame()
                  for i, (resp, r) in enumerate(zip(responses, msg.requests))]
        # Placing outputs (into a client's region, say) is part of producing them, as in
        # Triton; writing answers to clients is not.
        output_ns = timings.compute_output_ns + time.perf_counter_ns() - placing
        written, self._written = self._written, []
        self._channel.send(messages.Result(msg.batch_id, frames, timings.compute_input_ns,
                                           timings.compute_infer_ns, output_ns, rescheduled,
                                           timings.start_ns, written))
        if answers:
            # After the Result: the front serves the clients' next requests meanwhile.
            unsent = write_answers(answers, self._lent_sockets.backed_up)
            self._written.append([msg.batch_id, unsent])
            if unsent or time.perf_counter_ns() - timings.start_ns >= CARRY_WRITTEN_BELOW_NS:
                self._tell_written()  # a client waits for the rest, which the front writes
            else:
                # Should this process die before it tells, the front knows these connections
                # hold whole answers.
                table.mark_written(msg.batch_id)

    def _batch_input(self, ref: messages.TensorRef, block: memoryview) -> Input:
        location = ref.location
        if type(location) is InRegion:
            buffer = self._regions.input(location, ref.datatype)
            if self._regions.in_host_memory(location.region_id):
                return Input(ref.name, ref.datatype, ref.shape, buffer, location)
        elif type(location) is OnDevice:
            buffer = self._device_inputs.input(location, ref.datatype)
        else:
            offset, nbytes = location  # within the batch's input block
            buffer = block[offset:offset + nbytes]
        return Input(ref.name, ref.datatype, ref.shape, buffer)

    def _frame(self, resp, targets: dict, on_device=()) -> messages.ResponseFrame:
        if resp.error is not None:
            return messages.ResponseFrame(list(resp.error), [], resp.parameters, resp.answered)
        outputs = []
        for o in resp.outputs:
            target = targets.get(o.name) if targets else None
            if target is None:
                location = None
                if on_device and o.name in on_device:
                    location = self._keep_on_device(o)
                if location is None:
                    location = self._place(o)
            else:
                try:
                    location = self._place_in_region(o, target)
                except ValueError as exc:
                    # Triton fails the whole response when an output misses its region.
                    return messages.ResponseFrame(["INTERNAL", str(exc)], [], resp.parameters)
            outputs.append(messages.TensorRef(o.name, o.datatype, list(o.shape), location))
        return messages.ResponseFrame(None, outputs, resp.parameters)

    def _send_stream_response(self, row: int, resp, final: bool, targets=None,
                              on_device=()) -> None:
        frame = None if resp is None else self._frame(resp, targets, on_device)
        self._channel.send(messages.StreamResponse(row, final, frame))

    def _place_in_region(self, out, target: InRegion) -> WrittenToRegion:
        arr = out.array
        serialized = None
        if out.datatype == "BYTES":
            serialized = datatypes.serialize_bytes(arr.reshape(-1))
        nbytes = self._regions.write(target, out.name, arr, serialized)
        return WrittenToRegion(target.region_id, nbytes)

    def _keep_on_device(self, out):
        """The KeptOnDevice location of an output the model made on the GPU, kept there;
        None for an output in host memory, or one small enough to travel inline."""
        arr = out.array
        if not cuda.is_device_array(arr) or out.datatype == "BYTES" \
                or arr.nbytes <= self._inline_threshold:
            return None
        try:
            return self._kept.keep(arr)
        except Exception:  # cupy's CUDA errors have no common base worth naming
            log.warning("output '%s' cannot be shared on its GPU; it goes through host memory",
                        out.name, exc_info=True)
            return None

    def _place(self, out):
        """Inline bytes for small outputs, else a slot in the output arena."""
        arr = out.array
        if cuda.is_device_array(arr):
            arr = cuda.to_numpy(arr)
        if out.datatype == "BYTES":
            data = datatypes.serialize_bytes(arr.reshape(-1))
            nbytes = len(data)
        else:
            data = None
            nbytes = arr.nbytes
        if nbytes <= self._inline_threshold:
            return data if data is not None else _raw(arr)
        with self._output_lock:
            offset = self._output_alloc.alloc(nbytes)
            if offset is not None and not self._output_arena.reserve(offset + nbytes):
                self._output_alloc.free(offset)  # /dev/shm is full: writing would SIGBUS
                offset = None
        if offset is None:  # arena full: correctness over speed
            return data if data is not None else _raw(arr)
        dst = self._output_buf[offset:offset + nbytes]
        if data is not None:
            dst[:] = data
        else:
            np.copyto(np.frombuffer(dst, dtype=arr.dtype).reshape(arr.shape), arr)
        return InOutputArena(offset, nbytes)


class _RowResponder:
    """`respond(response, final)` of one request of a decoupled model, whose row in the
    request table says whether it was abandoned and how many responses the front consumed."""

    __slots__ = ("_table", "_row", "_send", "_sent")

    def __init__(self, table: RequestTable, row: int, send):
        self._table = table
        self._row = row
        self._send = send  # (row, response or None, final)
        self._sent = 0

    def __call__(self, response, final: bool) -> None:
        table = self._table
        if response is not None:
            while not table.abandoned(self._row):
                window = RESPONSE_WINDOW if table.consumed(self._row) else FIRST_WINDOW
                if self._sent - table.consumed(self._row) < window:
                    break
                table.wait_consumed(self._row, self._sent - window // 2, _WAIT_S)
            if table.abandoned(self._row):
                response = None  # nobody will read it
                if not final:
                    return
            else:
                self._sent += 1
        self._send(self._row, response, final)


# Only ever sent: the answer's bytes went to the client instead.
_WRITTEN_BY_WORKER = messages.ResponseFrame(None, [], written_by_worker=True)


def _unread_frame() -> messages.ResponseFrame:
    return messages.ResponseFrame(None, [])


def _final_only(send, row: int, response, final: bool) -> None:
    """`respond` of a decoupled model's null request: its row frees on the final flag."""
    if final:
        send(row, None, True)


def _raw(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without copying them (msgpack copies once). A cast
    of the array's own buffer costs a third of a uint8 view's; it refuses an empty shape."""
    return arr.data.cast("B") if arr.size else memoryview(b"")
