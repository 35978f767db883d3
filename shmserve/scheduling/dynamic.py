"""Triton's dynamic batcher: queued requests form batches whenever an instance has room.

A batch is a prefix of the queue (priority order, arrival order within a level) that stops
before a request that would overflow `max_batch_size`, whose non-ragged input shapes differ,
or that the custom strategy refuses. It leaves at once when it reaches the maximum or the
largest preferred size, or cannot grow; else, cut at the largest preferred size it passed
through, if any; else it waits up to `max_queue_delay` (counted from its oldest request) for
more requests, and then leaves as it is.

Everything happens in callbacks on the event loop (request arrival, a batch ending, a
timer), so there is no scheduler task to wake, and tests can drive it with a fake timer. A
batch's end frees its instance one turn of the loop later (see `_ran`), so that the requests
the front has read by then count as queued, as a multi-threaded front would have queued them.
"""

import asyncio
import functools
from typing import Optional

from shmserve.dispatch.pool import batch_error
from shmserve.errors import Code, ServerError
from shmserve.scheduling.queue import (GONE, QUEUED, TAKEN, Pending, QueueRejection, RequestQueue,
                                      resolve)
from shmserve.scheduling.timer import Alarm, LoopTimer


# The outcome of a request whose caller went away while it was queued.
_ABANDONED = object()


class DynamicBatcher:
    def __init__(self, pool, stats, *, max_batch_size: int, preferred_sizes=(),
                 max_queue_delay_ns: int = 0, preserve_ordering: bool = False,
                 queue: Optional[RequestQueue] = None, ragged_inputs=frozenset(), strategy=None,
                 timer=None):
        self._pool = pool
        self._stats = stats
        self._max = max_batch_size
        self._preferred = frozenset(preferred_sizes)
        # A batch that reaches the largest preferred size leaves at once.
        self._cap = min(max(preferred_sizes, default=max_batch_size), max_batch_size)
        self._delay_ns = max_queue_delay_ns
        self._queue = queue if queue is not None else RequestQueue()
        self._ragged = frozenset(ragged_inputs)
        self._strategy = strategy
        self._timer = timer or LoopTimer()
        # preserve_ordering: every request in arrival order, until its answer can leave.
        self._line: Optional[list] = [] if preserve_ordering else None
        self._line_head = 0
        self._wake = Alarm(self._timer, self._schedule)  # the pending batch's queue delay
        self._scheduling = False
        self._schedule_soon = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the event loop of the first request
        self._running: set = set()  # batches in flight, referenced until they end
        pool.add_listener(self._schedule)
        if self._queue.has_policy:
            # A batch queued behind a running one would leave the policy before it starts:
            # its timeouts could no longer reject it, nor a higher priority overtake it.
            pool.hold_one_batch()

    @classmethod
    def from_config(cls, pool, stats, config, strategy=None, timer=None) -> "DynamicBatcher":
        batching = config.dynamic_batching
        # With max_batch_size 0 every request runs alone, but priorities and the queue
        # policy still apply.
        return cls(pool, stats, max_batch_size=max(config.max_batch_size, 1),
                   preferred_sizes=list(batching.preferred_batch_size),
                   max_queue_delay_ns=batching.max_queue_delay_microseconds * 1000,
                   preserve_ordering=batching.preserve_ordering,
                   queue=RequestQueue.from_config(batching),
                   ragged_inputs={i.name for i in config.input if i.allow_ragged_batch},
                   strategy=strategy, timer=timer)

    def default_bound_applies(self, work) -> bool:
        """Whether the server's default queue bound may refuse `work`: only when the config
        sets no max_queue_size at any priority level."""
        return not self._queue.bounded

    async def submit(self, work, batch_size: int = 1, priority: int = 0, timeout_us: int = 0):
        """Queue one request until it has run; returns (WorkResponse, BatchTimings, queue ns).

        Raises QueueRejection when the queue is full or the request's queue timeout expires
        first. A caller that is cancelled while queued leaves the queue; once its batch runs,
        the batch finishes and the outputs meant for it are released.
        """
        queue = self._queue
        level = queue.level_of(priority)
        now = self._timer.now_ns()
        loop = self._loop
        if loop is None:
            # Kept: on Python 3.11 each get_running_loop() is a getpid() system call.
            loop = self._loop = asyncio.get_running_loop()
        entry = Pending(work, batch_size, self._shape_key(work), level, now,
                        loop.create_future())
        queue.push(entry)
        self._stats.pending += 1
        if self._line is not None:
            self._line.append(entry)
        timeout = queue.policy(level).timeout_for(timeout_us)
        if timeout:
            entry.deadline_ns = now + timeout
            entry.timer = self._timer.call_at(entry.deadline_ns,
                                              functools.partial(self._expire, entry))
        if not self._schedule_soon:
            # Requests that arrive in the same turn of the event loop (a burst the transports
            # read at once) are looked at together, so they can share a batch and one frame.
            self._schedule_soon = True
            loop.call_soon(self._scheduled_soon)
        try:
            return await entry.future
        except asyncio.CancelledError:
            if entry.state == QUEUED:
                self._leave_queue(entry)
                self._schedule()
            raise

    def _shape_key(self, work):
        ragged = self._ragged
        if not ragged and len(work.inputs) == 1:  # the usual request, without a generator
            t = work.inputs[0]
            return ((t.name, tuple(t.shape[1:])),)
        return tuple((t.name, tuple(t.shape[1:])) for t in work.inputs if t.name not in ragged)

    # -- forming batches ------------------------------------------------------------------

    def _scheduled_soon(self) -> None:
        self._schedule_soon = False
        self._schedule()

    def _schedule(self) -> None:
        """Dispatch every batch that is due while an instance has room."""
        if self._scheduling:
            return  # re-entered from a callback of our own dispatch
        self._scheduling = True
        try:
            pool = self._pool
            while self._queue:
                if not pool.has_room():
                    return
                count, wait_until, full = self._next_batch(self._timer.now_ns())
                if count == 0:
                    self._wake.set(wait_until)
                    return
                # A batch that can still grow queues behind a running one only once it is as
                # large as the latest sent (see pool.py); meanwhile it grows.
                inst = pool.try_acquire(count, can_grow=not full)
                if inst is None:
                    return
                self._dispatch(inst, self._queue.take(count))
        finally:
            self._scheduling = False

    def _next_batch(self, now: int):
        """(requests to send now, 0, whether the batch can grow no more) or (0, the time to
        look again, False)."""
        strategy = self._strategy
        walk = iter(self._queue)
        first = next(walk)
        size = first.batch_size
        count = 1
        oldest = first.enqueued_ns
        key = first.shape_key
        best_preferred = 1 if size in self._preferred else 0
        cap = self._cap
        full = size >= cap
        state = None
        if strategy is not None:
            state = strategy.start_batch()
            # A refused first request still runs, alone, so that nothing waits forever.
            if not strategy.include(state, first.work, first.batch_size, first.level):
                full = True
        try:
            if not full:
                for entry in walk:
                    if (size + entry.batch_size > self._max or entry.shape_key != key
                            or (strategy is not None
                                and not strategy.include(state, entry.work, entry.batch_size,
                                                         entry.level))):
                        full = True  # the batch cannot grow past this request
                        break
                    size += entry.batch_size
                    count += 1
                    if entry.enqueued_ns < oldest:
                        oldest = entry.enqueued_ns
                    if size in self._preferred:
                        best_preferred = count
                    if size >= cap:
                        full = True
                        break
        finally:
            if strategy is not None:
                strategy.end_batch(state)
        if full:
            # A request larger than one makes the batch overshoot the largest preferred size:
            # the preferred size it passed through, if any, goes instead.
            return (best_preferred if size > cap and best_preferred else count), 0, True
        if best_preferred:
            return best_preferred, 0, False
        due = oldest + self._delay_ns
        if now >= due:
            return count, 0, False
        return 0, due, False

    # -- running batches ------------------------------------------------------------------

    def _dispatch(self, inst, entries: list) -> None:
        now = self._timer.now_ns()
        for e in entries:
            e.state = TAKEN
            if e.timer is not None:
                e.timer.cancel()
                e.timer = None
        self._stats.pending -= len(entries)
        try:
            # A WorkerHandle sends the batch now and gives a future; a test's instance may
            # give a coroutine, which then runs as a task.
            batch = asyncio.ensure_future(inst.execute([e.work for e in entries]))
        except Exception as exc:
            self._failed(inst, entries, exc)
            return
        self._running.add(batch)
        batch.add_done_callback(functools.partial(self._ran, inst, entries, now))

    def _ran(self, inst, entries: list, dispatched_ns: int, batch: asyncio.Future) -> None:
        self._running.discard(batch)
        if batch.cancelled():  # the loop is shutting down
            self._failed(inst, entries, asyncio.CancelledError())
            return
        exc = batch.exception()
        if exc is not None:
            self._failed(inst, entries, exc)
            return
        responses, timings = batch.result()
        self._stats.record_execution(sum(e.batch_size for e in entries), timings)
        for e, response in zip(entries, responses):
            self._answer(e, (response, timings, dispatched_ns - e.enqueued_ns))
        # The instance takes its next batch one turn of the loop later, after the loop has
        # read the requests that arrived meanwhile: they join that batch rather than the one
        # after it (larger batches, more infer/s: perf/findings/2026-11-front-tuning.md).
        assert self._loop is not None  # set by the submit that queued these entries
        self._loop.call_soon(self._pool.release, inst, timings)

    def _failed(self, inst, entries: list, exc: BaseException) -> None:
        self._pool.release(inst)
        error = batch_error(inst, exc)
        for e in entries:
            self._answer(e, error)

    # -- answers --------------------------------------------------------------------------

    def _answer(self, entry: Pending, outcome) -> None:
        """Hand a result (or an exception) to the caller, in arrival order when asked to."""
        if self._line is None:
            _resolve(entry.future, outcome)
            return
        entry.outcome = outcome
        line = self._line
        i = self._line_head
        while i < len(line) and line[i].outcome is not None:
            head = line[i]
            line[i] = None
            i += 1
            _resolve(head.future, head.outcome)
            head.outcome = None
        if i > 256 and i * 2 > len(line):  # drop the answered prefix now and then
            del line[:i]
            i = 0
        self._line_head = i

    def _leave_queue(self, entry: Pending, outcome=_ABANDONED) -> None:
        """Take a queued request out of the queue, answering it with `outcome`."""
        self._queue.remove(entry)
        entry.state = GONE
        self._stats.pending -= 1
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        self._answer(entry, outcome)

    def _expire(self, entry: Pending) -> None:
        entry.timer = None
        if entry.state != QUEUED:
            return
        if self._timer.now_ns() < entry.deadline_ns:  # the timer fired early
            entry.timer = self._timer.call_at(entry.deadline_ns,
                                              functools.partial(self._expire, entry))
            return
        if self._queue.policy(entry.level).delay_on_timeout:
            if not entry.delayed:
                self._queue.delay(entry)
                self._schedule()
            return
        self._leave_queue(entry, QueueRejection("Request timeout expired"))
        self._schedule()

    def close(self) -> None:
        """Fail what is still queued (the model is going away)."""
        self._wake.cancel()
        if self._strategy is not None:
            self._strategy.close()
        error = ServerError(Code.UNAVAILABLE, "model is being unloaded")
        for entry in list(self._queue):
            self._leave_queue(entry, error)


def _resolve(future: asyncio.Future, outcome) -> None:
    if outcome is not _ABANDONED:
        resolve(future, outcome)
