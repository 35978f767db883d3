"""Fakes for the batchers' tests: a fake clock (FakeTimer), a fake instance that holds each
batch until the test finishes it (FakeInstance), `work` (a request), `settle` (lets the event
loop run), and Harness, a DynamicBatcher over fake instances and the fake clock. The
test_dynamic_batcher_* modules use them all, test_sequence_batcher.py the clock and `settle`."""

import asyncio
import heapq
import itertools

from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.work_types import BatchTimings, WorkInput, WorkRequest, WorkResponse
from shmserve.errors import ServerError
from shmserve.observability.stats import ModelStats
from shmserve.scheduling.dynamic import DynamicBatcher


US = 1000  # ns


class FakeTimer:
    def __init__(self):
        self.now = 0
        self._heap = []
        self._seq = itertools.count()

    def now_ns(self):
        return self.now

    def call_at(self, when, callback):
        handle = _Handle(callback)
        heapq.heappush(self._heap, (when, next(self._seq), handle))
        return handle

    def advance(self, ns):
        self.now += ns
        while self._heap and self._heap[0][0] <= self.now:
            _, _, handle = heapq.heappop(self._heap)
            if not handle.cancelled:
                handle.callback()


class _Handle:
    def __init__(self, callback):
        self.callback = callback
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


class FakeInstance:
    """Holds every batch until the test finishes it."""

    def __init__(self, name="inst_0"):
        self.instance_name = name
        self.alive = True
        self.running = []  # (requests, future)
        self.seen = []  # batch sizes in dispatch order, as lists of request ids
        self.refuse: ServerError | None = None

    def execute(self, batch):
        """As a WorkerHandle: the batch leaves at once (or is refused at once), its answer
        comes later."""
        if self.refuse is not None:
            raise self.refuse
        future = asyncio.get_running_loop().create_future()
        self.running.append((batch, future))
        self.seen.append([r.request_id for r in batch])
        return future

    def finish(self, index=0):
        batch, future = self.running.pop(index)
        future.set_result(([WorkResponse(None, parameters={"id": r.request_id}) for r in batch],
                           BatchTimings(1, 2, 3)))


def work(rid, shape=(1, 4), name="INPUT0"):
    return WorkRequest(rid, 0, 0, {}, [WorkInput(name, "FP32", list(shape), b"")], ["OUT"])


async def settle():
    for _ in range(10):
        await asyncio.sleep(0)


class Harness:
    def __init__(self, instances=1, depth=1, **kwargs):
        self.timer = FakeTimer()
        self.instances = [FakeInstance(f"inst_{i}") for i in range(instances)]
        self.pool = InstancePool(self.instances, depth=depth)
        self.stats = ModelStats()
        kwargs.setdefault("max_batch_size", 8)
        self.batcher = DynamicBatcher(self.pool, self.stats, timer=self.timer, **kwargs)
        self.inst = self.instances[0]

    def submit(self, rid, batch_size=1, priority=0, timeout_us=0, shape=None):
        shape = shape or (batch_size, 4)
        return asyncio.ensure_future(
            self.batcher.submit(work(rid, shape), batch_size, priority, timeout_us))

    async def block(self):
        """Occupy the (single, depth-1) instance with a request of its own."""
        blocker = self.submit("blocker")
        await settle()
        assert self.inst.seen[-1] == ["blocker"]
        return blocker


def run(coro):
    asyncio.run(coro)
