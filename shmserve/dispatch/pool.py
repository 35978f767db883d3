"""The instances of one model version, and choosing one to run a batch.

An instance whose batches are short may hold `depth` batches: the one it executes and one
queued behind it. A worker that finds its next batch already in its socket never goes to
sleep under load, and waking a sleeping process on another core costs tens of microseconds
on a VM, more than a small batch takes to run. An instance whose batches take longer than
`pipeline_below_us` holds one, as in Triton: its next batch forms when it is free, so every
request that arrived meanwhile joins it. Sent early, that batch would hold only the requests
queued so far (a model taking 20 ms a batch served a third fewer requests at concurrency 32,
its batches split three ways), to save a wake-up that is small beside its run. The
least-loaded instance is always chosen first. A model whose queue has a policy (priorities,
timeouts, a size bound) never pipelines: a request sent behind a running batch would have left
the policy before it starts (see hold_one_batch).

The instances may change while the pool serves (a reload that changes only the instance
groups, see repository/instances.py): `update` adds instances and retires others. A retired
instance takes no new batch from the pool, but what it holds runs to the end, and a scheduler
may still send work to it by name (a sequence bound to it) until it is forgotten.

A batch that could still grow, queued behind a running one, must hold at least as many
requests as the latest batch the instance was sent (try_acquire's `size`). Under load, a batch
sent the moment there is room holds only what came since the last one left: batches halve,
and the costs paid once per batch (a frame each way, a wake-up, the model's call) are paid
twice as often. Held back, the batch grows until it matches, or goes as it is when the
instance frees (less server CPU per request, more infer/s: perf/findings/
2026-11-front-tuning.md).
"""

import asyncio
import collections
import logging
from typing import Awaitable, Optional, Protocol, Sequence

from shmserve.dispatch.work_types import BatchTimings, WorkResponse
from shmserve.errors import Code, ServerError

log = logging.getLogger("shmserve.dispatch")

PIPELINE_DEPTH = 2
# Batches shorter than this (the model's time, input to output) are pipelined.
DEFAULT_PIPELINE_BELOW_US = 1000


class Instance(Protocol):
    """What the pool and the schedulers above require of a model instance: a WorkerHandle
    (dispatch/worker.py), or a test's fake. Instances are told apart by identity."""

    instance_name: str
    alive: bool  # it takes batches

    def execute(self, batch: list) -> Awaitable[tuple[list[WorkResponse], BatchTimings]]:
        """Run a batch of WorkRequests: a future, or a coroutine, of (one WorkResponse per
        request, in order, the batch's timings)."""


class InstancePool:
    """Works with any Instance, so the schedulers above can be tested with fake instances."""

    def __init__(self, instances: Sequence[Instance], depth: int = PIPELINE_DEPTH, limiter=None,
                 pipeline_below_us: int = DEFAULT_PIPELINE_BELOW_US):
        """`limiter`: the server's RateLimiter (--rate-limit=execution_count), which the
        instances it limits must satisfy too; they hold one batch at a time.
        `pipeline_below_us`: how short an instance's batches must be for it to hold `depth`
        (0: never)."""
        self.depth = depth
        self._limiter = limiter
        self._pipeline_below_us = pipeline_below_us
        self._pipeline_below_ns = pipeline_below_us * 1000
        self._hold_one = False
        # The most each may hold, and what it holds now, after its recent batches' lengths.
        self._max_depth: dict = {}
        self._depth: dict = {}
        self._batch_ns: dict = {}  # estimates of their batches' length
        self._load: dict = {}
        self._sent: dict = {}  # requests in the latest batch sent to each
        # Instances taken out by `update` that are not forgotten yet.
        self.retiring: set = set()
        self._waiters: collections.deque = collections.deque()
        self._listeners: list = []
        self._closed = False
        for inst in instances:
            self._register(inst)
        self.instances = list(instances)

    def _register(self, inst: Instance) -> None:
        limited = self._limiter is not None and self._limiter.limits(inst)
        self._max_depth[inst] = 1 if limited or self._hold_one else self.depth
        self._depth[inst] = self._max_depth[inst] if self._pipeline_below_us else 1
        self._batch_ns[inst] = 0
        self._load[inst] = 0
        self._sent[inst] = 0

    def hold_one_batch(self) -> None:
        """Each instance holds only the batch it runs, whatever its batches' length: a
        scheduler whose queue policy (priorities, timeouts, size bound) must govern every
        request until it starts asks for this (instances added later too)."""
        self._hold_one = True
        for inst in self.instances:
            self._max_depth[inst] = self._depth[inst] = 1

    def update(self, instances: list[Instance], limiter=None) -> list[Instance]:
        """Serve with `instances` from now on, in that order: those new to the pool (started
        already) take work at once; those left out retire, and are returned. `limiter`: the
        server's RateLimiter, which the pool obeys from now on if a new instance is limited
        by it."""
        if limiter is not None and self._limiter is None \
                and any(limiter.limits(i) for i in instances):
            self._limiter = limiter
        for inst in instances:
            if inst not in self._load:
                self._register(inst)
        kept = set(instances)
        retired = [i for i in self.instances if i not in kept]
        self.retiring.update(retired)
        self.instances = list(instances)
        self.wake_all()
        return retired

    def busy(self, inst: Instance) -> bool:
        """Whether the instance holds a batch the pool gave it."""
        return self._load.get(inst, 0) > 0

    def forget(self, inst: Instance) -> None:
        """A retired instance that holds nothing leaves for good (it is being stopped)."""
        self.retiring.discard(inst)
        for table in (self._max_depth, self._depth, self._batch_ns, self._load, self._sent):
            table.pop(inst, None)
        if self._limiter is not None:
            self._limiter.remove(inst)
        self.wake_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ready(self) -> bool:
        """Some instance can take work: what routing needs (asked of every request)."""
        if self._closed:
            return False
        for i in self.instances:
            if i.alive:
                return True
        return False

    @property
    def all_alive(self) -> bool:
        """Every instance runs: what readiness reports (one down or restarting makes the
        model not ready, though the others still serve)."""
        return not self._closed and all(i.alive for i in self.instances)

    def add_listener(self, callback) -> None:
        """`callback()` runs whenever room may have appeared (a batch ended, an instance came
        back): schedulers that dispatch without waiting use it."""
        self._listeners.append(callback)

    def try_acquire(self, size: int = 0, can_grow: bool = False) -> Optional[Instance]:
        """An instance with room for one more batch of `size` requests, or None; never waits.
        A batch that `can_grow` goes to a busy instance only if it is no smaller than the
        latest batch that instance was sent."""
        inst = self._pick(size if can_grow else None)
        if inst is not None:
            self._take(inst)
            self._sent[inst] = size
        return inst

    def _take(self, inst: Instance) -> None:
        self._load[inst] += 1
        if self._limiter is not None:
            self._limiter.take(inst)

    def has_room(self) -> bool:
        """Some instance could take a batch of some size."""
        return self._pick() is not None

    def try_acquire_instance(self, inst: Instance) -> bool:
        """Take room for one more batch on this very instance (the sequence batcher binds a
        sequence to one, which may be retiring); False when it is full, not alive, or
        forgotten."""
        load = self._load.get(inst)
        if load is None or not inst.alive or load >= self._depth[inst] or not self._fits(inst):
            return False
        self._take(inst)
        return True

    def _pick(self, size: int | None = None) -> Optional[Instance]:
        best = None
        best_load = self.depth
        limiter = self._limiter
        for inst in self.instances:
            load = self._load[inst]
            if load < best_load and load < self._depth[inst] and inst.alive \
                    and (not load or size is None or size >= self._sent[inst]) \
                    and (limiter is None or limiter.fits(inst, self)):
                best, best_load = inst, load
                if load == 0:
                    break
        return best

    def _fits(self, inst: Instance) -> bool:
        return self._limiter is None or self._limiter.fits(inst, self)

    async def acquire(self) -> Instance:
        """An instance with room for one more batch; waits while all are full."""
        while True:
            inst = self._pick()
            if inst is not None:
                self._take(inst)
                return inst
            if self._closed or not any(i.alive for i in self.instances):
                raise ServerError(Code.UNAVAILABLE, "no model instance is available")
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_next()  # pass our wake-up on to the next waiter
                raise

    def release(self, inst: Instance, timings: Optional[BatchTimings] = None) -> None:
        """`inst` finished a batch; `timings` (BatchTimings), when it ran to the end, tell
        how long the model took, and so whether the instance's next batches pipeline."""
        if inst not in self._load:  # forgotten (its pool closed while the batch ran)
            self._wake_next()
            self._notify()
            return
        if timings is not None:
            self._note_batch_length(inst, timings)
        if self._load[inst] > 0:
            self._load[inst] -= 1
            if self._limiter is not None:
                self._limiter.give_back(inst, self)  # may wake other models' pools first
        self._wake_next()
        self._notify()

    def _note_batch_length(self, inst: Instance, timings: BatchTimings) -> None:
        length = timings.compute_input_ns + timings.compute_infer_ns + timings.compute_output_ns
        # Falls to a shorter batch at once, rises by an eighth of a longer one: the lengths
        # are wall time in the worker, which a busy machine stretches now and then (a worker
        # that loses its core mid-batch), but never shortens.
        estimate = self._batch_ns[inst]
        estimate = length if length < estimate else estimate + (length - estimate) // 8
        self._batch_ns[inst] = estimate
        pipelines = estimate < self._pipeline_below_ns
        self._depth[inst] = self._max_depth[inst] if pipelines else 1

    def resources_freed(self) -> None:
        """The rate limiter has resources for one of these instances again."""
        self.wake_all()

    def instance_back(self, inst: Instance) -> None:
        """A restarted instance takes work again; its old batches all failed."""
        if inst not in self._load:
            return
        self._load[inst] = 0
        if self._limiter is not None:
            self._limiter.drop_held(inst)
        self.wake_all()

    def wake_all(self) -> None:
        """Let every waiter re-check (an instance died or came back, or the pool closed)."""
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
        self._notify()

    def _notify(self) -> None:
        for callback in self._listeners:
            callback()

    def _wake_next(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def close(self) -> None:
        self._closed = True
        if self._limiter is not None:
            for inst in self.instances + list(self.retiring):
                self._limiter.remove(inst)
        self.wake_all()


def batch_error(inst: Instance, exc: BaseException) -> ServerError:
    """What the requests of a batch that failed on `inst` are answered: its ServerError, or an
    INTERNAL one for anything else (a bug below the scheduler, or the loop shutting down),
    which is logged."""
    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, Exception):
        log.error("batch failed on model instance '%s'", inst.instance_name, exc_info=exc)
    return ServerError(Code.INTERNAL, f"batch failed on model instance "
                                      f"'{inst.instance_name}': {exc!r}")
