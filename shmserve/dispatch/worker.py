"""One model instance as seen from the front: its process, its channel, its arenas.

`execute` sends one Execute frame per batch and resolves when the Result frame comes back.
The batch's input bytes travel as one block (see `_layout`): inline in the frame when small,
else in one slot of the input arena, freed when the Result frame comes back.
Each request takes a row of the worker's request table for as long as the worker holds it
(see ipc/request_table.py). A decoupled model's requests carry a ResponseStream, fed by the
worker's StreamResponse frames until the final one; their batch's Result only ends the
execution.
A request may carry a prepared answer (`WorkRequest.answer`): its client's socket is lent to
the worker with the batch, which then writes the answer itself (see workers/answers.py).
Tensors in client shared-memory regions stay there: the worker maps each region when the first
batch that uses it is sent, and unmaps it when the region's `Region` says so (`unmap_region`).
A worker that dies fails the batches it holds (the running one and the one queued behind
it), and the streams still open, with an error naming the instance. With `detect_hangs`, so
does one that holds work and sends nothing for too long: it is killed. That check costs one
timer per instance, armed while it holds work; frames only note the time they came.
"""

import asyncio
import errno
import functools
import itertools
import logging
import os
import signal
import socket
import sys
from typing import Callable, Optional

from shmserve.dispatch.arena import InputArena, new_segment
from shmserve.dispatch.front_spin import FrontSpin
from shmserve.dispatch.memory_regions import CudaRegion, Region, RegionSlice, segment_region
# The records a batch carries, importable from here too: the dataplane imports them from here.
from shmserve.dispatch.work_types import (BatchTimings, DeviceTensor, WorkInput,  # noqa: F401
                                          WorkOutput, WorkRequest, WorkResponse)
from shmserve.errors import Code, ModelError, ServerError
from shmserve.ipc import messages
from shmserve.ipc.channel import AsyncChannel
from shmserve.ipc.idle_spin import DEFAULT_SPIN_US
from shmserve.ipc.request_table import SIZE as REQUEST_TABLE_BYTES
from shmserve.ipc.request_table import RequestTable, RowAllocator
from shmserve.observability import logs

log = logging.getLogger("shmserve.dispatch")

# Tensors up to this size travel inside the control frame: for small tensors a memcpy into
# the frame is cheaper than an arena slot and its release message. For inputs it bounds the
# batch's whole input block.
INLINE_THRESHOLD = 64 * 1024
# Each input name's run of tensors starts at a multiple of this in the input block, so that
# every tensor stays as aligned as one placed alone (arena slots are 64-byte aligned).
BLOCK_ALIGNMENT = 64
ARENA_BYTES = 256 * 1024 * 1024  # sparse: pages cost memory only once touched
# How long requests on a closed channel wait for the process's exit code before failing.
EXIT_REPORT_WAIT_S = 1.0
# How long a model's is_ready() may take before the instance counts as not ready (Triton's).
READINESS_TIMEOUT_S = 5.0


class WorkerHandle:
    def __init__(self, *, model_name: str, model_version: int, model_dir: str,
                 model_repository: str, model_config: dict, instance_name: str,
                 instance_kind: str, device_id: int, runtime_dir: str = "",
                 on_exit: Optional[Callable[["WorkerHandle"], None]] = None,
                 on_server_call: Optional[Callable] = None, spin_us: int = DEFAULT_SPIN_US,
                 front_spin: Optional[FrontSpin] = None):
        """`on_server_call(handle, ServerCall)` serves the model's calls into the server
        (BLS, model control), answered with `reply`; `spin_us`: how long the worker polls
        for its next frame before it blocks, while the machine has a core to spare (0:
        never; see ipc/idle_spin.py); `front_spin`: keeps the front polling around its
        batches (see front_spin.py), if given."""
        self.instance_name = instance_name
        self._spin_us = spin_us
        self._front_spin = front_spin
        self._init_args = dict(model_name=model_name, model_version=model_version,
                               model_dir=model_dir, model_repository=model_repository,
                               model_config=model_config, instance_name=instance_name,
                               instance_kind=instance_kind, device_id=device_id,
                               runtime_dir=runtime_dir)
        self._on_exit = on_exit
        self._on_server_call = on_server_call
        self._batch_ids = itertools.count(1)
        # batch id -> (future, input-arena slot or None, table rows to free at its Result)
        self._pending: dict = {}
        # batch id -> [(index, answer)] of the answers the worker is writing after its Result.
        self._writing: dict = {}
        self._streams: dict = {}  # table row -> ResponseStream still open
        self._table: Optional[RequestTable] = None
        self._rows: Optional[RowAllocator] = None
        self._channel: Optional[AsyncChannel] = None
        # The front's end of the socket that lends clients' sockets to the worker.
        self._lender: Optional[socket.socket] = None
        self._process: Optional[asyncio.subprocess.Process] = None
        self._ready: Optional[asyncio.Future] = None
        self._bye: Optional[asyncio.Future] = None
        # The model defines is_ready(); the answer to the CheckReady in flight, if any.
        self.readiness_hook = False
        self._readiness: Optional[asyncio.Future] = None
        # A KIND_GPU instance's GPU, as its worker found it (empty until then, or unknown):
        # the batches it runs are counted under that GPU's metric labels.
        self.gpu_uuid = ""
        self._input_arena: Optional[InputArena] = None
        self._output_arena = None
        self._output_buf = None
        self._output_region: Optional[Region] = None
        # Where the model's large BLS inputs go, and that segment as a region the target
        # instances map (see model_calls.py).
        self._bls_arena = None
        self._bls_region: Optional[Region] = None
        self._state_arena = None
        # Bumped at every start, so that releases meant for a dead process's arena are
        # never sent to its successor, whose slots at those offsets belong to others.
        self._generation = 0
        self.alive = False
        self._running = False  # started and not being stopped: an exit is a crash
        self._exit_watch: Optional[asyncio.Task] = None
        # The regions (client regions, other instances' arenas) this process has mapped, by id.
        self._mapped_regions: dict = {}
        self._log_context = logs.context(model=model_name, version=model_version,
                                         instance=instance_name)
        self._worker_log: Optional[logs.WorkerLog] = None  # of the current process
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._hang_timeout = 0.0  # seconds; 0: hangs are not looked for
        self._hang_timer: Optional[asyncio.TimerHandle] = None
        self._last_frame = 0.0  # loop time of the last frame, or of the start of work
        self._received: dict = {}  # table row -> responses of its open stream (hang check only)
        # The model's custom metrics, as its process last reported them (MetricsReport).
        self.custom_metrics: list = []
        # Asks for fresh ones (see workers/metrics_report.py): the eventfd the worker's
        # metrics thread reads, the asks written to it, and the scrapes waiting for answers.
        self._metrics_fd = -1
        self._metrics_asked = 0
        self._metrics_waiters: list = []  # (ask number, future)

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        """Spawn the process and load the model; ServerError(UNAVAILABLE) if it fails."""
        loop = self._loop = asyncio.get_running_loop()
        tag = self.instance_name
        self._generation += 1
        self._process = None
        self.custom_metrics = []  # a new process starts its metrics anew
        self._metrics_asked = 0
        self._answer_metrics_waiters()
        try:
            self._create_arenas(tag)
        except BaseException as exc:
            self._destroy_arenas()  # those made before the one that failed
            if isinstance(exc, OSError):  # ENOSPC when /dev/shm is full, EMFILE, ...
                raise ServerError(Code.UNAVAILABLE, f"cannot start model instance "
                                                    f"'{self.instance_name}': cannot create its "
                                                    f"shared memory: {exc}") from None
            raise
        self._rows = RowAllocator()
        self._mapped_regions = {}
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._close_lender()
        lender, lent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lender.setblocking(False)  # full means the worker is behind: the front answers then
        self._lender = lender
        lent_fd = lent.fileno()  # the worker's, under the same number
        worker_log = self._worker_log = logs.WorkerLog(self._log_context)
        try:
            stdin, stdout, stderr = worker_log.child_fds
            self._process = await asyncio.create_subprocess_exec(
                # The front's pid: the worker cleans up after a front that was killed.
                *worker_command("workers", str(child.fileno()), str(self._spin_us),
                                str(os.getpid())),
                pass_fds=(child.fileno(), self._table.wake_fd, lent_fd, self._metrics_fd),
                stdin=stdin, stdout=stdout, stderr=stderr, env=worker_env())
            await worker_log.started(self._process.pid)
            self._ready = loop.create_future()
            _, self._channel = await loop.create_unix_connection(
                lambda: AsyncChannel(self._on_message, self._on_closed), sock=parent)
        except BaseException as exc:
            parent.close()
            self._close_lender()
            if self._process is not None:
                self._process.kill()
                await self._process.wait()
            await worker_log.close()
            self._destroy_arenas()
            if isinstance(exc, OSError):
                raise ServerError(Code.UNAVAILABLE, f"cannot start model instance "
                                                    f"'{self.instance_name}': {exc}") from None
            raise
        finally:
            child.close()
            lent.close()
        self._channel.send(messages.Init(
            **self._init_args, input_arena=self._input_arena.name,
            output_arena=self._output_arena.name, request_table=self._table.segment.name,
            inline_threshold=INLINE_THRESHOLD,
            state_arena=self._state_arena.name if self._state_arena is not None else "",
            wake_fd=self._table.wake_fd, bls_arena=self._bls_arena.name,
            answer_fd=lent_fd, metrics_fd=self._metrics_fd))
        # Held here: the event loop keeps only a weak reference to tasks.
        self._exit_watch = asyncio.ensure_future(self._watch_exit())
        error = await self._ready
        if error:
            await self._reap()
            raise ServerError(Code.INTERNAL, error)  # the model's failure, as in Triton
        self.alive = True
        self._running = True

    def _create_arenas(self, tag: str) -> None:
        # Blocking, for the worker's metrics thread, which sleeps on it; the front's writes
        # never block (the count stays far below the eventfd's limit).
        self._metrics_fd = os.eventfd(0, os.EFD_CLOEXEC)
        self._input_arena = InputArena(f"{tag}.in", ARENA_BYTES)
        self._output_arena = new_segment(f"{tag}.out", ARENA_BYTES)
        self._output_buf = self._output_arena.buffer
        self._output_region = segment_region(f"{tag} output arena", self._output_arena.name,
                                             ARENA_BYTES)
        self._bls_arena = new_segment(f"{tag}.bls", ARENA_BYTES)
        self._bls_region = segment_region(f"{tag} BLS arena", self._bls_arena.name, ARENA_BYTES)
        wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self._table = RequestTable(new_segment(f"{tag}.req", REQUEST_TABLE_BYTES), wake_fd)
        except BaseException:
            os.close(wake_fd)
            raise
        # Both sides write to it with no way to fail a request instead: reserved whole.
        if not self._table.segment.reserve(REQUEST_TABLE_BYTES):
            raise OSError(errno.ENOSPC, "no room in /dev/shm for the request table")
        if self._init_args["model_config"].get("sequence_batching", {}).get("state"):
            self._state_arena = new_segment(f"{tag}.state", ARENA_BYTES)

    def execute(self, batch: list) -> asyncio.Future:
        """Send one batch of WorkRequests to the worker now; the future gives (one
        WorkResponse per request, in order, BatchTimings). Sending here rather than in a task
        saves the batch a turn of the event loop before the worker can start on it."""
        if not self.alive:
            raise ServerError(Code.UNAVAILABLE,
                              f"model instance '{self.instance_name}' is not available")
        batch_id = next(self._batch_ids)
        slot = None
        rows = self._take_rows(batch)
        lent = ()
        try:
            sockets, lent = self._lend_sockets(batch_id, batch)
            frames, pieces, nbytes = _layout(batch, rows, sockets)
            block, slot = self._place_block(pieces, nbytes)
            future = self._loop.create_future()
            self._map_regions(batch)
            plain = []  # (row, request) of the requests without a stream
            if self._hang_timeout:
                self._watch_for_hang()
            table = self._table
            for row, req in zip(rows, batch):
                if req.stream is not None:
                    self._streams[row] = req.stream
                    req.stream.attach(table, row)
                else:
                    req.held = (table, row)
                    plain.append((row, req))
            self._pending[batch_id] = (future, slot, plain, len(batch), lent)
            lone = len(batch) == 1 and batch[0].stream is not None and batch[0].stream.lone
            self._channel.send(messages.Execute(batch_id, block, frames, lone))
            if self._front_spin is not None:
                if len(plain) < len(batch):  # it streams
                    self._front_spin.hold(future, lone)
                else:
                    self._front_spin.watch(future)
        except BaseException as exc:
            self._pending.pop(batch_id, None)
            _return_unwritten(lent)
            self._free_block(slot)
            for row, req in zip(rows, batch):
                self._streams.pop(row, None)
                self._rows.give_back(row)
                req.held = None
            if isinstance(exc, ConnectionError):
                self.alive = False
                raise ServerError(Code.UNAVAILABLE, f"model instance '{self.instance_name}' is "
                                                    f"not available") from None
            raise
        return future

    def _lend_sockets(self, batch_id: int, batch: list) -> tuple[Optional[list], list]:
        """Send the worker the client sockets of the batch's prepared answers. Returns, per
        request, the index of its socket among those sent, or -1 when the worker may not
        answer it (None when none may); and the requests whose answers were lent, as
        (index in the batch, answer)."""
        if self._lender is None:
            return None, []
        fds = []
        index_of = {}  # descriptor -> its index in fds: an HTTP/2 connection is sent once
        sockets = []
        lent = []
        for i, req in enumerate(batch):
            answer = req.answer
            fd = answer.lend(self) if answer is not None else -1
            if fd < 0:
                sockets.append(-1)
                continue
            index = index_of.get(fd)
            if index is None:
                index = index_of[fd] = len(fds)
                fds.append(fd)
            sockets.append(index)
            lent.append((i, answer))
        if not lent:
            return None, []
        if len(fds) > messages.MAX_LENT_SOCKETS:  # the front answers a larger one
            _return_unwritten(lent)
            return None, []
        try:
            socket.send_fds(self._lender, [batch_id.to_bytes(8, "little")], fds)
        except OSError:  # the worker is behind, or gone: the front answers these
            _return_unwritten(lent)
            return None, []
        return sockets, lent

    def _close_lender(self) -> None:
        if self._lender is not None:
            self._lender.close()
            self._lender = None

    def _map_regions(self, batch: list) -> None:
        """Tell the worker of the client regions the batch uses that it has not mapped yet."""
        for req in batch:
            for region in req.regions:
                if region.region_id not in self._mapped_regions:
                    self.map_region(region)

    def map_region(self, region: Region) -> None:
        """Have the worker map `region` before it reads the next frame, unless it has."""
        if region.region_id in self._mapped_regions:
            return
        self._channel.send(_map_message(region))
        self._mapped_regions[region.region_id] = region
        region.mapped_by.add(self)

    def bls_slice(self, location: list) -> RegionSlice:
        """Where a BLS input lies: [offset, nbytes] in the model's BLS arena, or [region_id,
        offset, nbytes] in a region this process has mapped (an input of its own passed on
        as it came). ValueError when there is no such region or the range leaves it."""
        if len(location) == 2:
            region, (offset, nbytes) = self._bls_region, location
            where = "the BLS arena"
        else:
            region_id, offset, nbytes = location
            region = self._mapped_regions.get(region_id)
            where = f"a region this instance has mapped (id {region_id})"
        if region is None or type(offset) is not int or type(nbytes) is not int \
                or offset < 0 or nbytes < 0 or offset + nbytes > region.byte_size:
            raise ValueError(f"range [{offset}, {offset}+{nbytes}) is outside {where}")
        return RegionSlice(region, offset, nbytes)

    def unmap_region(self, region_id: int) -> None:
        """The region is gone and no request uses it any more: the worker unmaps it."""
        if region_id not in self._mapped_regions:
            return  # mapped by an earlier process of this instance, which took it along
        del self._mapped_regions[region_id]
        if self.alive:
            try:
                self._channel.send(messages.UnmapRegion(region_id))
            except ConnectionError:
                pass

    def _take_rows(self, batch: list) -> list:
        rows = []
        for req in batch:
            stream = req.stream
            if stream is not None and self._streams.get(stream.row) is stream:
                # A rescheduled request of an iterative sequence keeps its row, and with it
                # the count of responses its reader consumed.
                rows.append(stream.row)
                continue
            row = self._rows.take()
            if row is None:
                for req, taken in zip(batch, rows):
                    if req.stream is None or self._streams.get(taken) is not req.stream:
                        self._rows.give_back(taken)
                raise ServerError(Code.UNAVAILABLE, f"model instance '{self.instance_name}' holds "
                                                    f"too many requests")
            self._table.reset(row)
            rows.append(row)
        return rows

    def _release_outputs(self, offsets: list, kept: list, generation: int) -> None:
        if self.alive and generation == self._generation:
            try:
                self._channel.send(messages.Release(offsets, kept))
            except ConnectionError:
                pass  # the worker is gone, and its arena with it

    async def stop(self, timeout: float = 10.0) -> None:
        """Finalize the model and end the process (killed if it does not stop in time)."""
        self._running = False
        if self._process is None:
            return
        if self.alive and self._channel is not None:
            self._bye = asyncio.get_running_loop().create_future()
            try:
                self._channel.send(messages.Shutdown())
                await asyncio.wait_for(asyncio.shield(self._bye), timeout)
            except (ConnectionError, asyncio.TimeoutError):
                pass
        self.alive = False
        await self._reap(timeout)

    async def _reap(self, timeout: float = 5.0) -> None:
        # Closing our end first makes a worker blocked on its socket see EOF and exit.
        if self._channel is not None:
            self._channel.close()
        proc = self._process
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._worker_log is not None:
            await self._worker_log.close()  # what finalize() wrote is logged before stop ends
        self._close_lender()
        self._destroy_arenas()

    def _destroy_arenas(self) -> None:
        if self._metrics_fd >= 0:
            os.close(self._metrics_fd)
            self._metrics_fd = -1
        if self._input_arena is not None:
            self._input_arena.destroy()
            self._input_arena = None
        if self._output_region is not None:
            self._output_region.retire_when_unused()
            self._output_region = None
        if self._output_arena is not None:
            self._output_buf = None
            self._output_arena.close()
            self._output_arena.unlink()
            self._output_arena = None
        if self._bls_region is not None:
            self._bls_region.retire_when_unused()
            self._bls_region = None
        if self._bls_arena is not None:
            self._bls_arena.close()
            self._bls_arena.unlink()
            self._bls_arena = None
        if self._state_arena is not None:
            self._state_arena.close()
            self._state_arena.unlink()
            self._state_arena = None
        if self._table is not None:
            segment = self._table.segment
            os.close(self._table.wake_fd)
            self._table.close()
            segment.unlink()
            self._table = None

    def _place_block(self, pieces: list, nbytes: int) -> tuple:
        """(the Execute frame's input block, its input-arena slot or None)."""
        if nbytes > INLINE_THRESHOLD:
            slot = self._input_arena.put(pieces, nbytes)
            if slot is not None:
                return (messages.INPUT_ARENA, slot, nbytes), slot
            # arena full: correctness over speed, the block goes inline
        # msgpack copies a lone piece into the frame as it is: joining would copy it twice.
        return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), None

    def _free_block(self, slot: Optional[int]) -> None:
        if slot is not None and self._input_arena is not None:
            self._input_arena.free(slot)

    def _on_message(self, msg) -> None:
        if self._hang_timeout:
            self._last_frame = self._loop.time()
        if isinstance(msg, messages.StreamResponse):
            stream = self._streams.get(msg.row)
            if stream is None:
                return
            if msg.final:
                del self._streams[msg.row]
                self._rows.give_back(msg.row)
                if self._hang_timeout:
                    self._received.pop(msg.row, None)
            elif self._hang_timeout:
                self._received[msg.row] = self._received.get(msg.row, 0) + 1
            stream.push(None if msg.response is None else self._response(msg.response), msg.final)
        elif isinstance(msg, messages.Result):
            for batch_id, unsent in msg.written:
                self._answers_written(batch_id, unsent)
            entry = self._pending.pop(msg.batch_id, None)
            if entry is None:
                return
            future, slot, plain, count, lent = entry
            self._free_block(slot)
            for row, req in plain:
                self._rows.give_back(row)
                req.held = None
            if lent:
                writing = []
                for index, answer in lent:
                    if msg.responses and msg.responses[index].by_worker:
                        writing.append((index, answer))
                    else:
                        answer.returned(None)  # the front answers it
                if writing:
                    self._writing[msg.batch_id] = writing
            if msg.responses:
                responses = [self._response(frame) for frame in msg.responses]
            else:  # a decoupled model's batch: its responses went to the streams
                responses = [WorkResponse(None) for _ in range(count)]
            for index in msg.rescheduled:
                responses[index].rescheduled = True
            if future.done():  # the caller gave up: nobody will copy these outputs out
                for r in responses:
                    if r.release is not None:
                        r.release()
                return
            future.set_result((responses, BatchTimings(
                msg.compute_input_ns, msg.compute_infer_ns, msg.compute_output_ns,
                msg.compute_start_ns, self.gpu_uuid)))
        elif isinstance(msg, messages.Written):
            self._answers_written(msg.batch_id, msg.unsent)
        elif isinstance(msg, messages.Ready):
            self.readiness_hook = msg.readiness_hook
            self.gpu_uuid = msg.gpu_uuid
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg.error)
        elif isinstance(msg, messages.ReadyState):
            if self._readiness is not None and not self._readiness.done():
                self._readiness.set_result(bool(msg.ready))
        elif isinstance(msg, messages.MetricsReport):
            if msg.families is not None:  # else unchanged since its last report
                self.custom_metrics = msg.families
            self._answer_metrics_waiters(msg.answered)
        elif isinstance(msg, messages.ServerCall):
            if self._on_server_call is not None:
                self._on_server_call(self, msg)
            else:
                self.reply(messages.ServerReply(msg.call_id, True, messages.ResponseFrame(
                    ["UNSUPPORTED", "this server does not serve calls from models"], [])))
        elif isinstance(msg, messages.Bye):
            self._resolve_bye()

    def _answers_written(self, batch_id: int, unsent: list) -> None:
        writing = self._writing.pop(batch_id, None)
        if writing is not None:
            rest = dict(unsent)  # written first: before anything else is written
            for index, answer in writing:
                answer.returned(rest.get(index, b""))

    def reply(self, msg: messages.ServerReply) -> bool:
        """Answer a ServerCall; False when the worker is gone."""
        try:
            self._channel.send(msg)
        except (ConnectionError, AttributeError):
            return False
        return True

    def _resolve_bye(self) -> None:
        if self._bye is not None and not self._bye.done():
            self._bye.set_result(None)

    def _response(self, frame: messages.ResponseFrame) -> WorkResponse:
        if frame.error is not None:
            code, text = frame.error
            return WorkResponse(ModelError(_code(code), text, frame.answered),
                                parameters=frame.parameters)
        outputs = []
        slots = []
        kept = []
        for t in frame.outputs:
            loc = t.location
            if isinstance(loc, bytes):
                data = loc
            elif loc[0] == messages.CLIENT_REGION:
                data = b""  # the client reads it from its own region
            elif loc[0] == messages.DEVICE_MEMORY:
                _, raw_handle, device_id, offset, nbytes, keep_id = loc
                outputs.append(WorkOutput(t.name, t.datatype, t.shape, b"", device=DeviceTensor(
                    raw_handle, device_id, offset, nbytes)))
                kept.append(keep_id)
                continue
            else:
                _, offset, nbytes = loc
                outputs.append(WorkOutput(t.name, t.datatype, t.shape,
                                          self._output_buf[offset:offset + nbytes], offset))
                slots.append(offset)
                continue
            outputs.append(WorkOutput(t.name, t.datatype, t.shape, data))
        if frame.by_worker:
            return WorkResponse(None, outputs, frame.parameters, sent=True)
        if not slots and not kept:
            return WorkResponse(None, outputs, frame.parameters)
        return WorkResponse(None, outputs, frame.parameters,
                            functools.partial(self._release_outputs, slots, kept,
                                              self._generation),
                            arena=self._output_region if slots else None)

    async def fresh_custom_metrics(self, timeout: float) -> None:
        """Ask the worker for its custom metrics, and wait until it has answered (then
        `custom_metrics` holds values as they were at this call, or newer), `timeout`
        seconds at most: a worker that does not answer in time shows its last values."""
        if not self.alive or self._metrics_fd < 0:
            return
        self._metrics_asked += 1
        future = self._loop.create_future()
        waiter = (self._metrics_asked, future)
        self._metrics_waiters.append(waiter)
        os.eventfd_write(self._metrics_fd, 1)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if waiter in self._metrics_waiters:
                self._metrics_waiters.remove(waiter)

    def _answer_metrics_waiters(self, answered: Optional[int] = None) -> None:
        """Wake the scrapes whose asks the worker has answered; all of them when `answered`
        is None (the process is gone: its last values are all there is)."""
        waiting = []
        for waiter in self._metrics_waiters:
            asked, future = waiter
            if answered is not None and asked > answered:
                waiting.append(waiter)
            elif not future.done():
                future.set_result(None)
        self._metrics_waiters = waiting

    def _on_closed(self, exc) -> None:
        self.alive = False
        self._resolve_bye()
        self._answer_metrics_waiters()
        cancel_calls = getattr(self._on_server_call, "cancel_all_of", None)
        if cancel_calls is not None:  # nobody is left to read their answers
            cancel_calls(self)
        # The socket closes first when the process dies: its exit code, which _watch_exit
        # reports in a moment, tells the client more. Only a process that closed its end and
        # lives on is left for this to fail.
        self._loop.call_later(EXIT_REPORT_WAIT_S, self._fail_pending_of, self._generation,
                              "closed its connection to the server")

    def _fail_pending_of(self, generation: int, why: str) -> None:
        if generation == self._generation:  # not a process started since
            self._fail_pending(why)

    async def _watch_exit(self) -> None:
        proc = self._process
        worker_log = self._worker_log
        code = _exit_text(await proc.wait())
        unexpected = self._running
        self._running = False
        self.alive = False
        await worker_log.close()  # the process's last lines come before the news of its end
        if unexpected:
            log.error("model instance '%s' (pid %s) exited with %s", self.instance_name,
                      proc.pid, code, extra=self._log_context)
        self._resolve_bye()
        if self._ready is not None and not self._ready.done():
            # Triton's words for a stub that died before it was ready (its tests look for
            # them), then how it ended.
            self._ready.set_result(f"Stub process '{self.instance_name}' is not healthy. "
                                   f"(model instance '{self.instance_name}' exited with "
                                   f"{code} while loading; see the server log)")
        self._fail_pending(f"exited with {code}")
        if unexpected and self._on_exit is not None:
            self._on_exit(self)

    def detect_hangs(self, timeout: float) -> None:
        """From now on, an instance that holds work (a batch not yet answered, or a stream
        still open) and sends no frame for `timeout` seconds is hung: it is killed, its
        requests fail saying so, and its exit is reported like any other (`on_exit`)."""
        self._hang_timeout = timeout

    def kill(self, why: str) -> None:
        """End the process now, without finalizing the model: its requests fail with an error
        naming the instance and saying that its process `why`."""
        proc = self._process
        if proc is None or proc.returncode is not None:
            return
        self.alive = False
        self._fail_pending(why)
        try:
            proc.kill()
        except ProcessLookupError:  # exited already; _watch_exit reports it
            pass

    @property
    def holds_work(self) -> bool:
        return bool(self._pending or self._streams)

    def _watch_for_hang(self) -> None:
        """A batch is about to be sent: silence counts from now if the instance was idle."""
        if not self._pending and not self._streams:
            self._last_frame = self._loop.time()
        if self._hang_timer is None:
            self._hang_timer = self._loop.call_at(self._last_frame + self._hang_timeout,
                                                  self._check_hang)

    def _check_hang(self) -> None:
        self._hang_timer = None
        if not self.alive or not self.holds_work:
            return  # disarmed until work comes again
        now = self._loop.time()
        if self._waiting_on_readers():
            self._last_frame = now  # a sender held back by its slow reader is not hung
        due = self._last_frame + self._hang_timeout
        if now < due:
            self._hang_timer = self._loop.call_at(due, self._check_hang)
            return
        log.error("model instance '%s' (pid %s) holds requests and sent nothing for %g s "
                  "(--model-instance-timeout-secs): killing it", self.instance_name, self.pid,
                  self._hang_timeout)
        self.kill(f"stopped answering within {self._hang_timeout:g} s "
                  f"(--model-instance-timeout-secs) and was killed")

    def _waiting_on_readers(self) -> bool:
        """Whether some open stream has responses its reader has not handed over yet: the
        model's sender may be waiting on them (see workers/loop.py)."""
        table = self._table
        return table is not None and any(
            self._received.get(row, 0) > table.consumed(row) for row in self._streams)

    async def model_is_ready(self, timeout: float = READINESS_TIMEOUT_S) -> bool:
        """The answer of the model's is_ready() in this instance; False if it takes longer
        than `timeout`. The worker answers between batches. A check still running is not
        asked again: later callers wait for its answer (as Triton's Python backend does)."""
        if not self.alive:
            return False
        if self._readiness is None or self._readiness.done():
            self._readiness = asyncio.get_running_loop().create_future()
            try:
                self._channel.send(messages.CheckReady())
            except ConnectionError:
                self._readiness.set_result(False)
        try:
            return await asyncio.wait_for(asyncio.shield(self._readiness), timeout)
        except asyncio.TimeoutError:
            return False

    def _fail_pending(self, why: str) -> None:
        if self._readiness is not None and not self._readiness.done():
            self._readiness.set_result(False)
        error = ModelError(Code.INTERNAL, f"Failed to process the request(s) for model instance "
                                          f"'{self.instance_name}', message: the instance's "
                                          f"process {why}")
        self._received.clear()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.fail(error)
        pending, self._pending = self._pending, {}
        writing, self._writing = self._writing, {}
        whole = self._table.written_mark() if self._table is not None else 0
        for batch_id, lent in writing.items():
            for _, answer in lent:
                if batch_id == whole:
                    answer.returned(b"")
                else:
                    answer.lost()
        for future, slot, plain, _, lent in pending.values():
            for _, req in plain:
                req.held = None
            _return_unwritten(lent)  # it writes answers only after the batch's Result
            self._free_block(slot)
            if not future.done():
                future.set_exception(error)


def _return_unwritten(lent: list) -> None:
    """The worker writes none of these lent answers: the front answers them."""
    for _, answer in lent:
        answer.returned(None)


def _layout(batch: list, rows: list, sockets: Optional[list] = None
            ) -> tuple[list, list, int]:
    """The batch's RequestFrames, with its input bytes laid out as one block, input-major: for
    each input name, in order of first appearance, the tensors of that name of every request
    that has one, back to back in batch order (so a batched model can view them as one array).

    `sockets`: per request, the index of the client socket its prepared answer goes to, or
    -1 when the front answers it (None: the front answers all).

    Returns the frames (each input located within the block), the block's pieces in order
    (alignment padding included), and the block's size.
    """
    frames = []
    placed = []  # (TensorRef, its bytes)
    for index, (req, row) in enumerate(zip(batch, rows)):
        refs = []
        for t in req.inputs:
            data = t.data
            if type(data) is RegionSlice:
                refs.append(messages.TensorRef(t.name, t.datatype, t.shape, (
                    data.region.region_id, data.offset, data.nbytes)))
                continue
            if type(data) is DeviceTensor:
                refs.append(messages.TensorRef(t.name, t.datatype, t.shape, (
                    messages.DEVICE_MEMORY, data.raw_handle, data.device_id, data.offset,
                    data.nbytes)))
                continue
            ref = messages.TensorRef(t.name, t.datatype, t.shape, None)
            refs.append(ref)
            placed.append((ref, data))
        output_regions = {name: (s.region.region_id, s.offset, s.nbytes)
                          for name, s in req.output_regions.items()}
        trace = req.trace
        trace_id, trace_context = (0, "") if trace is None else (trace.id, trace.context)
        answer = None
        if sockets is not None and sockets[index] >= 0:
            answer = [sockets[index], *req.answer.frame]
        frames.append(messages.RequestFrame(req.request_id, req.correlation_id, req.flags,
                                            req.parameters, refs, req.requested_outputs, row,
                                            output_regions, req.sequence_slot, req.ready,
                                            trace_id, trace_context, req.device_outputs,
                                            answer, req.timeout_us))
    if len(batch) > 1:  # one request's input names are distinct: already input-major
        placed = _by_name(placed)
    pieces = []
    size = 0
    name = None
    for ref, data in placed:
        if ref.name != name:
            name = ref.name
            pad = -size % BLOCK_ALIGNMENT
            if pad:
                pieces.append(bytes(pad))
                size += pad
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        ref.location = (size, n)
        pieces.append(data)
        size += n
    return frames, pieces, size


def _map_message(region: Region):
    if isinstance(region, CudaRegion):
        return messages.MapCudaRegion(region.region_id, region.raw_handle, region.device_id,
                                      region.byte_size)
    return messages.MapSystemRegion(region.region_id, region.key, region.offset,
                                    region.byte_size, list(region.identity))


def _by_name(placed: list) -> list:
    """`placed` grouped by input name, names in order of first appearance, order kept within."""
    runs: dict = {}
    for pair in placed:
        run = runs.get(pair[0].name)
        if run is None:
            runs[pair[0].name] = [pair]
        else:
            run.append(pair)
    return [pair for run in runs.values() for pair in run]


def _exit_text(returncode: int) -> str:
    """'code 3', or 'code -9 (SIGKILL)' for a process a signal ended."""
    if returncode < 0:
        try:
            return f"code {returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            pass
    return f"code {returncode}"


def _code(name: str) -> Code:
    try:
        return Code[name]
    except KeyError:
        return Code.INTERNAL


# `python -m` would put the current directory first on sys.path, so a server started from a
# directory holding a `workers` or `shmserve` folder (an older checkout, a project's own
# workers) would run that code in its workers. Dropped before the module is found; -P would do
# the same, from Python 3.11 on.
_RUN_MODULE = ("import runpy, sys\n"
               "if sys.path and sys.path[0] == '': del sys.path[0]\n"
               "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def worker_command(module: str, *args: str) -> list:
    """The command line that runs `module` (`workers`, say) as a child process, with `args` as
    its sys.argv[1:]; run it with worker_env()."""
    return [sys.executable, "-c", _RUN_MODULE, module, *args]


def worker_env() -> dict:
    env = dict(os.environ)
    # Workers must import this checkout's `workers` and `shmserve.ipc` even when the server
    # runs from a source tree rather than an installed package.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
