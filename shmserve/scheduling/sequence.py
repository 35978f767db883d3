"""Triton's sequence batcher: every request of a sequence (one correlation id, from the request
with START to the one with END) runs on the same model instance, in the same batch slot, in
order, so that the model may keep the sequence's state there.

Each instance has a number of slots: `max_batch_size` of them (one if it is 0) with the
`direct` strategy, `max_candidate_sequences` with `oldest`. A new sequence takes the free slot
with the lowest index (spreading sequences over instances first); with every slot taken it
waits in the backlog, in arrival order, for a slot to free up. A slot frees when its
sequence's END request leaves for its instance, or when the sequence has been idle (nothing
queued, nothing running) for `max_sequence_idle_microseconds`; a later request of that
sequence without START is refused, as in Triton.

A batch takes at most one request per slot, so a sequence's requests run one after another
(batches of one instance run in order). `direct`: the batch covers slots 0 up to the highest
one holding a sequence, and a slot with nothing queued gets a null request (zero inputs,
READY false) whose answer is dropped, as Triton does for models that index state by batch
row; it waits for `minimum_slot_utilization` of the slots to be ready, at most
`max_queue_delay_microseconds`. `oldest`: the oldest queued heads, up to `max_batch_size`,
with the dynamic batcher's preferred sizes and queue delay; no null requests.

`iterative_sequence`: a request without a correlation id gets one of its own and START; it
is a whole sequence. When the model asks to run it again (release flag RESCHEDULE) it goes
back to its slot, flags cleared, and joins the next batch with whatever else is queued; when
it ends, its slot frees at once, so a waiting request joins the very next batch (continuous
batching).

An update of the model's instances (see repository/instances.py) adds slots for the instances
added; an instance removed keeps the slots whose sequences are still running, so those
sequences end where they began, and takes no new sequence (as Triton's scheduler update): it
stops once none is left (`holds_sequences`).

Like the dynamic batcher, everything happens in callbacks on the event loop.
"""

import asyncio
import bisect
import collections
import functools
import itertools
import logging
from typing import Optional

from shmserve.dispatch.pool import batch_error
from shmserve.dispatch.work_types import WorkInput, WorkRequest
from shmserve.errors import Code, Refused, ServerError
from shmserve.ipc import datatypes
from shmserve.scheduling.queue import GONE, QUEUED, TAKEN, resolve
from shmserve.scheduling.timer import Alarm, LoopTimer

log = logging.getLogger("shmserve.scheduling")

SEQUENCE_START = 1
SEQUENCE_END = 2


class _Request:
    __slots__ = ("work", "sequence", "enqueued_ns", "requeued_ns", "future", "state",
                 "queue_ns", "ran")

    def __init__(self, work, sequence, enqueued_ns: int, future):
        self.work = work
        self.sequence = sequence
        self.enqueued_ns = enqueued_ns  # its arrival, which orders it among the queued
        self.requeued_ns = enqueued_ns  # when it last joined the queue
        self.future = future
        self.state = QUEUED
        self.queue_ns = -1  # how long it waited before its latest run
        self.ran = False


class _Sequence:
    __slots__ = ("correlation_id", "slot", "queue", "running", "last_ns", "ended")

    def __init__(self, correlation_id, now_ns: int):
        self.correlation_id = correlation_id
        self.slot: Optional[_Slot] = None  # None while in the backlog
        self.queue: collections.deque = collections.deque()  # of _Request
        self.running = 0  # its requests now in a batch
        self.last_ns = now_ns  # last arrival or completion, for the idle timeout
        self.ended = False


class _Slot:
    __slots__ = ("instance", "position", "index", "sequence")

    def __init__(self, instance, position: int, index: int):
        self.instance = instance
        self.position = position  # numbers the instance, in the order the batcher got them
        self.index = index
        self.sequence: Optional[_Sequence] = None

    @property
    def order(self) -> tuple:
        return self.index, self.position


class SequenceBatcher:
    def __init__(self, pool, stats, *, model_name: str, max_batch_size: int,
                 slots_per_instance: int, oldest: bool = False, max_queue_delay_ns: int = 0,
                 minimum_slot_utilization: float = 0.0, preferred_sizes=(),
                 idle_ns: int = 1_000_000_000, iterative: bool = False, timer=None):
        self._pool = pool
        self._stats = stats
        self._model = model_name
        self._max = max(max_batch_size, 1)
        self._oldest = oldest
        self._delay_ns = max_queue_delay_ns
        self._min_ready = minimum_slot_utilization * slots_per_instance
        self._preferred = sorted(p for p in preferred_sizes if p <= self._max)
        self._cap = self._preferred[-1] if self._preferred else self._max
        self._idle_ns = idle_ns
        self._iterative = iterative
        self._timer = timer or LoopTimer()
        self._slots_per_instance = slots_per_instance
        self._positions = itertools.count()
        self._slots = [self._new_slots(inst) for inst in pool.instances]
        # Batches each instance (by position) is running. An iterative model's instance runs
        # one at a time: a request that arrives during a step joins the next one with the
        # rescheduled requests, rather than run beside them in a batch of its own.
        self._busy: collections.Counter = collections.Counter()
        self._free = sorted((s for slots in self._slots for s in slots), key=lambda s: s.order)
        self._retiring: set = set()  # instances removed that still hold sequences
        self._sequences: dict = {}  # correlation id -> _Sequence that requests may still join
        self._live: set = set()  # every _Sequence that has not ended, joinable or not
        self._backlog: collections.deque = collections.deque()  # of _Sequence without a slot
        self._next_id = 1  # for iterative requests that come without a correlation id
        self._reaper: Optional[asyncio.TimerHandle] = None
        self._wake = Alarm(self._timer, self._schedule)  # a partial batch's queue delay
        self._scheduling = False
        self._schedule_soon = False
        self._running: set = set()
        pool.add_listener(self._schedule)

    @classmethod
    def from_config(cls, pool, stats, config, timer=None) -> "SequenceBatcher":
        batching = config.sequence_batching
        common = dict(model_name=config.name, max_batch_size=config.max_batch_size,
                      idle_ns=batching.max_sequence_idle_microseconds * 1000,
                      iterative=batching.iterative_sequence, timer=timer)
        if batching.HasField("oldest"):
            oldest = batching.oldest
            slots = oldest.max_candidate_sequences or max(config.max_batch_size, 1)
            return cls(pool, stats, slots_per_instance=slots, oldest=True,
                       max_queue_delay_ns=oldest.max_queue_delay_microseconds * 1000,
                       preferred_sizes=list(oldest.preferred_batch_size), **common)
        direct = batching.direct
        return cls(pool, stats, slots_per_instance=max(config.max_batch_size, 1),
                   max_queue_delay_ns=direct.max_queue_delay_microseconds * 1000,
                   minimum_slot_utilization=direct.minimum_slot_utilization, **common)

    def default_bound_applies(self, work) -> bool:
        """Whether the server's default queue bound may refuse `work`: only a request that
        starts a sequence, since refusing one in the middle would break a sequence that
        already holds state in the model."""
        return bool(work.flags & SEQUENCE_START) or (self._iterative and not work.correlation_id)

    async def submit(self, work, batch_size: int = 1, priority: int = 0, timeout_us: int = 0):
        """Queue one request of a sequence until it has run; returns (WorkResponse,
        BatchTimings, queue ns). Priorities and queue timeouts do not apply to sequences."""
        if batch_size > 1:
            raise Refused(Code.INVALID_ARG, f"inference request to model '{self._model}' must "
                                            f"specify batch-size 1 due to requirements of "
                                            f"sequence batcher")
        entry = self._enqueue(work)
        if not self._schedule_soon:
            self._schedule_soon = True
            asyncio.get_running_loop().call_soon(self._scheduled_soon)
        try:
            return await entry.future
        except asyncio.CancelledError:
            # A request that never ran leaves; one that already ran (an iterative request
            # between two steps) goes on, so that the model sees it cancelled and frees what
            # it holds for it.
            if entry.state == QUEUED and not entry.ran:
                entry.sequence.queue.remove(entry)
                entry.state = GONE
                self._stats.pending -= 1
            raise

    def _enqueue(self, work) -> _Request:
        corrid = work.correlation_id
        if self._iterative and not corrid:
            corrid = work.correlation_id = self._new_id()
            work.flags = SEQUENCE_START
        if type(corrid) not in (int, str) or (type(corrid) is int and corrid < 0):
            raise Refused(Code.INVALID_ARG, f"sequence_id of a request to model "
                                            f"'{self._model}' must be an unsigned integer "
                                            f"or a string, got {corrid!r}")
        if not corrid:
            raise Refused(Code.INVALID_ARG, f"inference request to model '{self._model}' must "
                                            f"specify a non-zero or non-empty correlation ID")
        now = self._timer.now_ns()
        sequence = self._sequences.get(corrid)
        if sequence is None:
            if not work.flags & SEQUENCE_START:
                raise Refused(Code.INVALID_ARG,
                              f"inference request for sequence {corrid} to model "
                              f"'{self._model}' must specify the START flag on the first "
                              f"request of the sequence")
            sequence = self._sequences[corrid] = _Sequence(corrid, now)
            self._live.add(sequence)
            slot = self._take_free_slot()
            if slot is None:
                self._backlog.append(sequence)
            else:
                _bind(sequence, slot)
            self._arm_reaper()
        elif work.flags & SEQUENCE_START:
            # As in Triton, the new sequence takes over the old one's slot (or backlog place).
            log.warning("sequence %s for model '%s' has a conflict: the previous sequence did "
                        "not end before this sequence start", corrid, self._model)
        entry = _Request(work, sequence, now, asyncio.get_running_loop().create_future())
        sequence.queue.append(entry)
        sequence.last_ns = now
        if work.flags & SEQUENCE_END:
            del self._sequences[corrid]  # a later request of this id starts a new sequence
        self._stats.pending += 1
        return entry

    def _new_id(self) -> int:
        while self._next_id in self._sequences:
            self._next_id += 1
        corrid = self._next_id
        self._next_id += 1
        return corrid

    # -- slots ----------------------------------------------------------------------------

    def _new_slots(self, inst) -> list:
        position = next(self._positions)
        return [_Slot(inst, position, i) for i in range(self._slots_per_instance)]

    # -- instances added and removed while serving ------------------------------------------

    def add_instances(self, instances) -> None:
        """Slots for instances the pool serves with from now on; backlog sequences take them."""
        for inst in instances:
            slots = self._new_slots(inst)
            self._slots.append(slots)
            for slot in slots:
                bisect.insort(self._free, slot, key=lambda s: s.order)
        self._schedule()

    def retire_instances(self, instances) -> None:
        """The instances take no new sequence; those they hold go on until they end."""
        gone = set(instances)
        self._free = [slot for slot in self._free if slot.instance not in gone]
        self._retiring |= gone
        for inst in gone:
            self._drop_if_unused(inst)

    def holds_sequences(self, inst) -> bool:
        """Whether a sequence is bound to one of the instance's slots."""
        for slots in self._slots:
            if slots[0].instance is inst:
                return any(slot.sequence is not None for slot in slots)
        return False

    def _drop_if_unused(self, inst) -> None:
        """A retiring instance's slots go once no sequence holds any of them."""
        for k, slots in enumerate(self._slots):
            if slots[0].instance is inst:
                if all(slot.sequence is None for slot in slots):
                    # A new list: _schedule may be walking the old one.
                    self._slots = self._slots[:k] + self._slots[k + 1:]
                    self._retiring.discard(inst)
                return

    def _take_free_slot(self):
        for i, slot in enumerate(self._free):
            if slot.instance.alive:
                del self._free[i]
                return slot
        return None

    def _fill_free_slots(self) -> None:
        """Backlog sequences take slots that were free but on an instance that was down."""
        while self._backlog:
            slot = self._take_free_slot()
            if slot is None:
                return
            _bind(self._backlog.popleft(), slot)

    def _end_sequence(self, sequence: _Sequence) -> None:
        """Its slot goes to the first sequence of the backlog, or back to the free slots."""
        if sequence.ended:
            return
        sequence.ended = True
        self._live.discard(sequence)
        if self._sequences.get(sequence.correlation_id) is sequence:
            del self._sequences[sequence.correlation_id]
        slot = sequence.slot
        if slot is None:
            self._backlog.remove(sequence)
            return
        slot.sequence = sequence.slot = None
        if slot.instance in self._retiring:
            self._drop_if_unused(slot.instance)
        elif self._backlog:
            _bind(self._backlog.popleft(), slot)
        else:
            bisect.insort(self._free, slot, key=lambda s: s.order)

    # -- the idle timeout -----------------------------------------------------------------

    def _arm_reaper(self) -> None:
        if self._reaper is None and self._live:
            self._reaper = self._timer.call_at(self._timer.now_ns() + self._idle_ns, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        now = self._timer.now_ns()
        due = None
        # Sequences whose END came are reaped too: their END request may have been cancelled.
        for sequence in list(self._live):
            if sequence.queue or sequence.running:
                continue
            idle_until = sequence.last_ns + self._idle_ns
            if now >= idle_until:
                log.info("sequence %s of model '%s' was idle for %d us: its slot is released",
                         sequence.correlation_id, self._model, self._idle_ns // 1000)
                self._end_sequence(sequence)
            elif due is None or idle_until < due:
                due = idle_until
        if self._live:
            self._reaper = self._timer.call_at(due or now + self._idle_ns, self._reap)
        self._schedule()

    # -- forming batches ------------------------------------------------------------------

    def _scheduled_soon(self) -> None:
        self._schedule_soon = False
        self._schedule()

    def _schedule(self) -> None:
        """Send every batch that is due to an instance that has room for it."""
        if self._scheduling:
            return
        self._scheduling = True
        try:
            self._fill_free_slots()
            wait_until = 0
            now = self._timer.now_ns()
            progress = True
            while progress:
                progress = False
                for slots in self._slots:
                    if self._iterative and self._busy[slots[0].position]:
                        continue
                    batch, due = (self._oldest_batch if self._oldest else self._direct_batch)(
                        slots, now)
                    if not batch:
                        if due and (not wait_until or due < wait_until):
                            wait_until = due
                        continue
                    inst = slots[0].instance
                    if self._pool.try_acquire_instance(inst):
                        self._dispatch(inst, batch, now)
                        progress = True
            if wait_until:
                self._wake.set(wait_until)
        finally:
            self._scheduling = False

    def _direct_batch(self, slots: list, now: int):
        """([(slot, request or None for a null request)], 0) or ([], time to look again)."""
        highest = -1
        ready = 0
        oldest = None
        for slot in slots:
            sequence = slot.sequence
            if sequence is None:
                continue
            highest = slot.index
            if sequence.queue:
                ready += 1
                head = sequence.queue[0].enqueued_ns
                if oldest is None or head < oldest:
                    oldest = head
        if not ready:
            return [], 0
        assert oldest is not None  # set with every count of `ready`
        if ready < self._min_ready and now < oldest + self._delay_ns:
            return [], oldest + self._delay_ns
        return [(slot, slot.sequence.queue[0] if slot.sequence and slot.sequence.queue
                 else None) for slot in slots[:highest + 1]], 0

    def _oldest_batch(self, slots: list, now: int):
        heads = [(slot.sequence.queue[0].enqueued_ns, slot.index, slot) for slot in slots
                 if slot.sequence is not None and slot.sequence.queue]
        if not heads:
            return [], 0
        heads.sort()
        count = len(heads)
        if count < self._cap and now < heads[0][0] + self._delay_ns:
            passed = bisect.bisect_right(self._preferred, count)
            if not passed:
                return [], heads[0][0] + self._delay_ns
            count = self._preferred[passed - 1]
        return [(slot, slot.sequence.queue[0]) for _, _, slot in heads[:min(count, self._cap)]], 0

    # -- running batches ------------------------------------------------------------------

    def _dispatch(self, inst, batch: list, now: int) -> None:
        works = []
        taken = []  # (index in the batch, _Request)
        template = next(entry.work for _, entry in batch if entry is not None)
        for slot, entry in batch:
            if entry is None:
                works.append(_null_request(template, slot.index))
                continue
            sequence = entry.sequence
            sequence.queue.popleft()
            sequence.running += 1
            entry.state = TAKEN
            entry.queue_ns = now - entry.requeued_ns
            entry.ran = True
            work = entry.work
            work.sequence_slot = slot.index
            taken.append((len(works), entry))
            works.append(work)
            if work.flags & SEQUENCE_END and not self._iterative:
                self._end_sequence(sequence)
        self._stats.pending -= len(taken)
        position = batch[0][0].position
        self._busy[position] += 1
        try:
            # A WorkerHandle sends the batch now and gives a future; a test's instance may
            # give a coroutine, which then runs as a task.
            execution = asyncio.ensure_future(inst.execute(works))
        except Exception as exc:
            self._failed(inst, position, taken, exc)
            return
        self._running.add(execution)
        execution.add_done_callback(functools.partial(self._ran, inst, position, taken))

    def _failed(self, inst, position: int, taken: list, exc: BaseException) -> None:
        self._busy[position] -= 1
        error = batch_error(inst, exc)
        for _, entry in taken:
            self._finish(entry, error)
        self._pool.release(inst)

    def _ran(self, inst, position: int, taken: list, batch: asyncio.Future) -> None:
        self._running.discard(batch)
        if batch.cancelled():  # the loop is shutting down
            self._failed(inst, position, taken, asyncio.CancelledError())
            return
        exc = batch.exception()
        if exc is not None:
            self._failed(inst, position, taken, exc)
            return
        responses, timings = batch.result()
        self._busy[position] -= 1
        self._stats.record_execution(len(taken), timings)
        answered = set()
        for index, entry in taken:
            answered.add(index)
            response = responses[index]
            if response.rescheduled and self._iterative:
                self._record_iteration(entry, timings)
                self._requeue(entry)
            else:
                self._finish(entry, (response, timings, entry.queue_ns))
        for index, response in enumerate(responses):
            if index not in answered and response.release is not None:
                response.release()  # a null request's outputs
        self._pool.release(inst, timings)  # and with the room it makes, the next batch

    def _record_iteration(self, entry: _Request, timings) -> None:
        """Triton's statistics count every step of an iterative request as an inference and
        a success (probed on 2.51); the dataplane records the last one, with the answer."""
        self._stats.record_success(
            batch_size=1, request_ns=self._timer.now_ns() - entry.enqueued_ns,
            queue_ns=entry.queue_ns, compute_input_ns=timings.compute_input_ns,
            compute_infer_ns=timings.compute_infer_ns,
            compute_output_ns=timings.compute_output_ns, device=timings.gpu_uuid)

    def _requeue(self, entry: _Request) -> None:
        sequence = entry.sequence
        sequence.running -= 1
        sequence.last_ns = entry.requeued_ns = self._timer.now_ns()
        entry.work.flags = 0
        entry.state = QUEUED
        sequence.queue.appendleft(entry)
        self._stats.pending += 1

    def _finish(self, entry: _Request, outcome) -> None:
        sequence = entry.sequence
        sequence.running -= 1
        sequence.last_ns = self._timer.now_ns()
        entry.state = GONE
        if self._iterative:
            self._end_sequence(sequence)  # the request was the whole sequence
        resolve(entry.future, outcome)

    def close(self) -> None:
        """Fail what is still queued (the model is going away)."""
        self._wake.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        error = ServerError(Code.UNAVAILABLE, "model is being unloaded")
        for slots in self._slots:
            for slot in slots:
                if slot.sequence is not None:
                    self._fail_queued(slot.sequence, error)
        for sequence in self._backlog:
            self._fail_queued(sequence, error)

    def _fail_queued(self, sequence: _Sequence, error: ServerError) -> None:
        while sequence.queue:
            entry = sequence.queue.popleft()
            entry.state = GONE
            self._stats.pending -= 1
            resolve(entry.future, error)


def _bind(sequence: _Sequence, slot: _Slot) -> None:
    sequence.slot = slot
    slot.sequence = sequence


def _null_request(template, slot_index: int):
    """A request for an idle slot of a direct batch: `template`'s inputs, zero-filled."""
    inputs = [WorkInput(t.name, t.datatype, t.shape, bytes(_zero_size(t))) for t in template.inputs]
    return WorkRequest("", 0, 0, {}, inputs, list(template.requested_outputs),
                       sequence_slot=slot_index, ready=False)


def _zero_size(tensor) -> int:
    count = datatypes.element_count(tensor.shape)
    if tensor.datatype == "BYTES":
        return 4 * count  # every element an empty string
    return count * datatypes.element_size(tensor.datatype)
