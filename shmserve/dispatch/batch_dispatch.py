"""The batches and streams one model instance holds, from the Execute frame that sends a batch
to the frames that answer it.

`send` sends one Execute frame per batch; the batch's future resolves when its Result frame
comes back (`result`). The batch's input bytes travel as one block (batch_layout.py).
Each request takes a row of the worker's request table for as long as the worker holds it
(see ipc/request_table.py). A decoupled model's requests carry a ResponseStream, fed by the
worker's StreamResponse frames (`stream_response`) until the final one; their batch's Result
only ends the execution. Outputs in the output arena are views of it until their response's
`release`, which tells the worker (unless its process has been replaced since:
`generation`). A worker that dies fails the batches it holds (`fail`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

from shmserve.dispatch.batch_layout import layout, place_block
from shmserve.dispatch.front_spin import FrontSpin
from shmserve.dispatch.hang_watch import HangWatch
from shmserve.dispatch.instance_memory import InstanceMemory
from shmserve.dispatch.region_mapping import MappedRegions
from shmserve.dispatch.stream import ResponseStream
from shmserve.dispatch.work_types import BatchTimings, DeviceTensor, WorkOutput, WorkResponse
from shmserve.errors import Code, ModelError, ServerError
from shmserve.fastpath.worker_loans import WorkerLoans, return_unwritten
from shmserve.ipc import messages
from shmserve.ipc.locations import InOutputArena, KeptOnDevice, WrittenToRegion
from shmserve.ipc.request_table import RowAllocator

if TYPE_CHECKING:
    from shmserve.dispatch.worker import WorkerHandle


class SentBatch(NamedTuple):
    """A batch the worker holds, until its Result."""

    future: asyncio.Future  # gives (its WorkResponses, BatchTimings)
    slot: Optional[int]  # its input block's input-arena slot, if it has one
    plain: list  # (row, request) of its requests without a stream
    size: int  # its requests (not `count`, which would hide tuple.count)
    lent: list  # (index in the batch, answer) of the answers whose sockets were lent


class BatchDispatch:
    def __init__(self, instance: WorkerHandle, memory: InstanceMemory, loans: WorkerLoans,
                 regions: MappedRegions, hangs: HangWatch, front_spin: Optional[FrontSpin],
                 send: Callable[[object], None]):
        """`instance`: the handle whose batches these are (its `instance_name`, `alive` and
        `gpu_uuid` are read); `send(frame)` sends a frame to its current process."""
        self._instance = instance
        self._memory = memory
        self._loans = loans
        self._regions = regions
        self._hangs = hangs
        self._front_spin = front_spin
        self._send = send
        self._batch_ids = itertools.count(1)
        self.pending: dict[int, SentBatch] = {}  # by batch id
        self.streams: dict[int, ResponseStream] = {}  # table row -> stream still open
        self._received: dict = {}  # table row -> responses of its open stream (hang check only)
        self.rows: Optional[RowAllocator] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # Bumped at every start, so that releases meant for a dead process's arena are
        # never sent to its successor, whose slots at those offsets belong to others.
        self.generation = 0

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """A new process is being started: every row of its request table is free."""
        self._loop = loop
        self.generation += 1
        self.rows = RowAllocator()

    @property
    def holds_work(self) -> bool:
        return bool(self.pending or self.streams)

    def send(self, batch: list) -> asyncio.Future:
        """Send one batch of WorkRequests to the worker now; the future gives (one
        WorkResponse per request, in order, BatchTimings). ConnectionError when the worker
        is gone."""
        batch_id = next(self._batch_ids)
        slot = None
        rows = self._take_rows(batch)
        lent: list = []
        try:
            sockets, lent = self._loans.lend(batch_id, batch)
            frames, pieces, nbytes = layout(batch, rows, sockets)
            arena, loop = self._memory.input_arena, self._loop
            assert arena is not None and loop is not None  # begin() and the start made them
            block, slot = place_block(arena, pieces, nbytes)
            future = loop.create_future()
            self._regions.map_batch(batch)
            plain = []  # (row, request) of the requests without a stream
            if self._hangs.timeout:
                self._hangs.work_sent(idle=not self.pending and not self.streams)
            table = self._memory.table
            for row, req in zip(rows, batch):
                if req.stream is not None:
                    self.streams[row] = req.stream
                    req.stream.attach(table, row)
                else:
                    req.held = (table, row)
                    plain.append((row, req))
            self.pending[batch_id] = SentBatch(future, slot, plain, len(batch), lent)
            lone = len(batch) == 1 and batch[0].stream is not None and batch[0].stream.lone
            self._send(messages.Execute(batch_id, block, frames, lone))
            if self._front_spin is not None:
                if len(plain) < len(batch):  # it streams
                    self._front_spin.hold(future, lone)
                else:
                    self._front_spin.watch(future)
        except BaseException:
            self.pending.pop(batch_id, None)
            return_unwritten(lent)
            self._memory.free_block(slot)
            allocator = self.rows
            assert allocator is not None  # _take_rows used it
            for row, req in zip(rows, batch):
                self.streams.pop(row, None)
                allocator.give_back(row)
                req.held = None
            raise
        return future

    def _take_rows(self, batch: list) -> list:
        rows = []
        allocator, table = self.rows, self._memory.table
        assert allocator is not None and table is not None  # begin() and the start made them
        for req in batch:
            stream = req.stream
            if stream is not None:
                kept = stream.row
                if self.streams.get(kept) is stream:
                    # A rescheduled request of an iterative sequence keeps its row, and with
                    # it the count of responses its reader consumed.
                    rows.append(kept)
                    continue
            row = allocator.take()
            if row is None:
                for req, taken in zip(batch, rows):
                    if req.stream is None or self.streams.get(taken) is not req.stream:
                        allocator.give_back(taken)
                raise ServerError(Code.UNAVAILABLE, f"model instance "
                                                    f"'{self._instance.instance_name}' holds "
                                                    f"too many requests")
            table.reset(row)
            rows.append(row)
        return rows

    def stream_response(self, msg: messages.StreamResponse) -> None:
        stream = self.streams.get(msg.row)
        if stream is None:
            return
        if msg.final:
            del self.streams[msg.row]
            assert self.rows is not None  # the row came from it
            self.rows.give_back(msg.row)
            if self._hangs.timeout:
                self._received.pop(msg.row, None)
        elif self._hangs.timeout:
            self._received[msg.row] = self._received.get(msg.row, 0) + 1
        stream.push(None if msg.response is None else self.response(msg.response), msg.final)

    def result(self, msg: messages.Result) -> None:
        for batch_id, unsent in msg.written:
            self._loans.written(batch_id, unsent)
        sent = self.pending.pop(msg.batch_id, None)
        if sent is None:
            return
        future, slot, plain, count, lent = sent
        self._memory.free_block(slot)
        allocator = self.rows
        assert allocator is not None  # the rows came from it
        for row, req in plain:
            allocator.give_back(row)
            req.held = None
        if lent:
            self._loans.answered(msg.batch_id, lent, msg.responses)
        if msg.responses:
            responses = [self.response(frame) for frame in msg.responses]
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
            msg.compute_start_ns, self._instance.gpu_uuid)))

    def response(self, frame: messages.ResponseFrame) -> WorkResponse:
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
                outputs.append(WorkOutput(t.name, t.datatype, t.shape, loc))
            elif type(loc) is InOutputArena:
                output_buf = self._memory.output_buf
                assert output_buf is not None  # a process that writes outputs has its arena
                outputs.append(WorkOutput(t.name, t.datatype, t.shape,
                                          output_buf[loc.offset:loc.offset + loc.nbytes],
                                          loc.offset))
                slots.append(loc.offset)
            elif type(loc) is WrittenToRegion:
                # The client reads it from its own region.
                outputs.append(WorkOutput(t.name, t.datatype, t.shape, b""))
            else:
                assert type(loc) is KeptOnDevice
                outputs.append(WorkOutput(t.name, t.datatype, t.shape, b"", device=DeviceTensor(
                    loc.raw_handle, loc.device_id, loc.offset, loc.nbytes)))
                kept.append(loc.keep_id)
        if frame.written_by_worker:
            return WorkResponse(None, outputs, frame.parameters, written_by_worker=True)
        if not slots and not kept:
            return WorkResponse(None, outputs, frame.parameters)
        return WorkResponse(None, outputs, frame.parameters,
                            functools.partial(self._release_outputs, slots, kept,
                                              self.generation),
                            arena=self._memory.output_region if slots else None)

    def _release_outputs(self, offsets: list, kept: list, generation: int) -> None:
        if self._instance.alive and generation == self.generation:
            try:
                self._send(messages.Release(offsets, kept))
            except ConnectionError:
                pass  # the worker is gone, and its arena with it

    def waiting_on_readers(self) -> bool:
        """Whether some open stream has responses its reader has not handed over yet: the
        model's sender may be waiting on them (see workers/loop.py)."""
        table = self._memory.table
        return table is not None and any(
            self._received.get(row, 0) > table.consumed(row) for row in self.streams)

    def fail(self, error: ModelError) -> None:
        """The worker is gone, or being killed: every batch and stream it holds fails with
        `error`; the answers it was writing are the front's again, or lost."""
        self._received.clear()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.fail(error)
        pending, self.pending = self.pending, {}
        table = self._memory.table
        self._loans.lost(table.written_mark() if table is not None else 0)
        for future, slot, plain, _, lent in pending.values():
            for _, req in plain:
                req.held = None
            return_unwritten(lent)  # it writes answers only after the batch's Result
            self._memory.free_block(slot)
            if not future.done():
                future.set_exception(error)


def _code(name: str) -> Code:
    try:
        return Code[name]
    except KeyError:
        return Code.INTERNAL
