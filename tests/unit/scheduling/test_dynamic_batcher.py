"""The dynamic batcher against fake instances and a fake clock: batches form as Triton's do."""

import asyncio
import heapq
import itertools

import pytest

from shmserve import eager
from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.work_types import BatchTimings, WorkInput, WorkRequest, WorkResponse
from shmserve.errors import Code, ServerError
from shmserve.observability.stats import ModelStats
from shmserve.scheduling.dynamic import DynamicBatcher
from shmserve.scheduling.queue import QueuePolicy, QueueRejection, RequestQueue

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


def test_queued_requests_form_one_batch_when_the_instance_frees():
    async def main():
        h = Harness()
        blocker = await h.block()
        tasks = [h.submit(f"r{i}") for i in range(3)]
        await settle()
        assert h.stats.pending == 3
        h.inst.finish()
        await settle()
        assert h.inst.seen == [["blocker"], ["r0", "r1", "r2"]]
        h.inst.finish()
        await settle()
        assert (await blocker)[0].parameters == {"id": "blocker"}
        assert [(await t)[0].parameters["id"] for t in tasks] == ["r0", "r1", "r2"]
        assert h.stats.execution_count == 2 and h.stats.pending == 0
        assert sorted(h.stats.batches) == [1, 3]
    run(main())


def test_a_request_read_in_the_turn_a_batch_ends_joins_the_next_batch():
    async def main():
        h = Harness()
        await h.block()
        first = h.submit("r0")
        await settle()
        h.inst.finish()
        await asyncio.sleep(0)  # the blocker's end is handled; its instance frees next turn
        assert h.inst.seen == [["blocker"]]
        # As the front submits a request it has just read: its first step runs at once.
        second = eager.start(h.batcher.submit(work("r1"), 1, 0, 0), asyncio.get_running_loop())
        await settle()
        assert h.inst.seen == [["blocker"], ["r0", "r1"]]
        h.inst.finish()
        assert [(await t)[0].parameters["id"] for t in (first, second)] == ["r0", "r1"]
    run(main())


def test_batches_never_exceed_max_batch_size():
    async def main():
        h = Harness(max_batch_size=4)
        await h.block()
        for i in range(10):
            h.submit(f"r{i}")
        await settle()
        for _ in range(4):
            h.inst.finish()
            await settle()
        assert [len(b) for b in h.inst.seen] == [1, 4, 4, 2]
    run(main())


def test_request_batch_sizes_count_and_a_request_that_would_overflow_waits():
    async def main():
        h = Harness(max_batch_size=8)
        await h.block()
        for i in range(3):
            h.submit(f"r{i}", batch_size=3)
        await settle()
        h.inst.finish()
        await settle()
        assert h.inst.seen[1] == ["r0", "r1"]  # 3+3; a third would make 9
        h.inst.finish()
        await settle()
        assert h.inst.seen[2] == ["r2"]
        assert 6 in h.stats.batches
    run(main())


def test_largest_reached_preferred_size_is_cut_without_delay():
    async def main():
        h = Harness(max_batch_size=8, preferred_sizes=[2, 4])
        await h.block()
        for i in range(5):
            h.submit(f"r{i}")
        await settle()
        h.inst.finish()
        await settle()
        assert h.inst.seen[1] == ["r0", "r1", "r2", "r3"]  # 4 is preferred, 5 is not
        h.inst.finish()
        await settle()
        assert h.inst.seen[2] == ["r4"]
    run(main())


def test_queue_delay_holds_a_partial_batch_until_it_expires():
    async def main():
        h = Harness(max_batch_size=8, preferred_sizes=[8], max_queue_delay_ns=1000 * US)
        h.submit("a")
        await settle()
        h.timer.advance(400 * US)
        h.submit("b")
        await settle()
        assert h.inst.seen == []  # the instance is free, but the batch may still grow
        h.timer.advance(599 * US)
        await settle()
        assert h.inst.seen == []
        h.timer.advance(1 * US)  # 1000 us after the oldest request
        await settle()
        assert h.inst.seen == [["a", "b"]]
    run(main())


def test_a_request_completing_the_preferred_size_dispatches_at_once():
    async def main():
        h = Harness(max_batch_size=8, preferred_sizes=[4], max_queue_delay_ns=10_000 * US)
        for i in range(3):
            h.submit(f"r{i}")
        await settle()
        assert h.inst.seen == []
        h.submit("r3")
        await settle()
        assert h.inst.seen == [["r0", "r1", "r2", "r3"]]
    run(main())


def test_a_reached_preferred_size_leaves_without_waiting_for_the_delay():
    async def main():
        h = Harness(max_batch_size=8, preferred_sizes=[2, 6], max_queue_delay_ns=100 * US,
                    depth=2)
        h.submit("r0")
        await settle()
        assert h.inst.seen == []  # 1 is not preferred: wait for more
        h.submit("r1")
        h.submit("r2")
        await settle()
        # 2 was reached, 6 was not: two leave together at once; the third waits its delay.
        assert h.inst.seen == [["r0", "r1"]]
        h.timer.advance(100 * US)
        await settle()
        # Due, but smaller than the batch it would queue behind: it leaves when that ends.
        assert h.inst.seen == [["r0", "r1"]]
        h.inst.finish()
        await settle()
        assert h.inst.seen == [["r0", "r1"], ["r2"]]
    run(main())


def test_a_batch_queues_behind_a_running_one_once_it_is_as_large():
    async def main():
        h = Harness(max_batch_size=8, depth=2)
        tasks = [h.submit(f"a{i}") for i in range(3)]
        await settle()
        assert h.inst.seen == [["a0", "a1", "a2"]]
        tasks += [h.submit("b0"), h.submit("b1")]
        await settle()
        assert h.inst.seen == [["a0", "a1", "a2"]]  # 2 < 3: it waits, and grows
        tasks.append(h.submit("b2"))
        await settle()
        assert h.inst.seen == [["a0", "a1", "a2"], ["b0", "b1", "b2"]]  # queued behind
        tasks.append(h.submit("c0"))
        h.inst.finish()
        await settle()
        assert len(h.inst.seen) == 2  # c0 is smaller than the batch still running
        h.inst.finish()
        await settle()
        assert h.inst.seen[-1] == ["c0"]  # the instance was idle: it left alone
        h.inst.finish()
        assert [(await t)[0].parameters["id"] for t in tasks] == [
            "a0", "a1", "a2", "b0", "b1", "b2", "c0"]
    run(main())


def test_a_batch_that_cannot_grow_queues_behind_a_running_one_at_once():
    async def main():
        h = Harness(max_batch_size=4, depth=2)
        for i in range(3):
            h.submit(f"a{i}")
        await settle()
        h.submit("full", batch_size=4)  # one request, but the largest batch there is
        await settle()
        assert h.inst.seen == [["a0", "a1", "a2"], ["full"]]
    run(main())


def test_after_the_delay_everything_pending_leaves():
    async def main():
        h = Harness(max_batch_size=8, preferred_sizes=[4], max_queue_delay_ns=100 * US)
        for i in range(3):
            h.submit(f"r{i}")
        await settle()
        assert h.inst.seen == []
        h.timer.advance(100 * US)
        await settle()
        assert h.inst.seen == [["r0", "r1", "r2"]]
    run(main())


def test_different_shapes_do_not_batch_unless_the_input_is_ragged():
    async def main():
        for ragged, expected in ((set(), [["a", "b"], ["c"]]), ({"INPUT0"}, [["a", "b", "c"]])):
            h = Harness(ragged_inputs=ragged)
            await h.block()
            h.submit("a", shape=(1, 4))
            h.submit("b", shape=(1, 4))
            h.submit("c", shape=(1, 5))
            await settle()
            h.inst.finish()
            await settle()
            if len(h.inst.running) == 1 and len(expected) > 1:
                h.inst.finish()
                await settle()
            assert h.inst.seen[1:] == expected
    run(main())


def test_higher_priority_overtakes_and_same_level_stays_fifo():
    async def main():
        h = Harness(max_batch_size=1, queue=RequestQueue(levels=3, default_level=3))
        await h.block()
        h.submit("low0")           # priority 0 -> default level 3
        h.submit("mid0", priority=2)
        h.submit("high0", priority=1)
        h.submit("high1", priority=1)
        h.submit("odd", priority=9)  # beyond the levels -> default level
        await settle()
        for _ in range(5):
            h.inst.finish()
            await settle()
        assert [b[0] for b in h.inst.seen[1:]] == ["high0", "high1", "mid0", "low0", "odd"]
    run(main())


def test_full_queue_rejects_at_once():
    async def main():
        h = Harness(queue=RequestQueue(default_policy=QueuePolicy(max_queue_size=2)))
        await h.block()
        h.submit("a")
        h.submit("b")
        await settle()
        with pytest.raises(QueueRejection) as info:
            await h.batcher.submit(work("c"), 1)
        assert info.value.code.name == "UNAVAILABLE"
        assert info.value.message == "Exceeds maximum queue size"
        assert h.stats.pending == 2
    run(main())


def test_queue_policy_per_priority_level():
    async def main():
        queue = RequestQueue(levels=2, default_level=2,
                             level_policies={1: QueuePolicy(max_queue_size=1)})
        h = Harness(queue=queue)
        await h.block()
        h.submit("h0", priority=1)
        h.submit("l0")
        h.submit("l1")  # level 2 has the default, unbounded policy
        await settle()
        with pytest.raises(QueueRejection):
            await h.batcher.submit(work("h1"), 1, 1)
    run(main())


def test_queue_timeout_rejects_a_request_still_waiting():
    async def main():
        policy = QueuePolicy(timeout_ns=500 * US)
        h = Harness(queue=RequestQueue(default_policy=policy))
        await h.block()
        waiting = h.submit("late")
        await settle()
        h.timer.advance(499 * US)
        await settle()
        assert not waiting.done()
        h.timer.advance(1 * US)
        await settle()
        with pytest.raises(QueueRejection, match="^Request timeout expired$"):
            await waiting
        assert h.stats.pending == 0
        h.inst.finish()
        await settle()
        assert h.inst.seen == [["blocker"]]
    run(main())


@pytest.mark.parametrize("queue", [
    RequestQueue(default_policy=QueuePolicy(timeout_ns=500 * US)),
    RequestQueue(default_policy=QueuePolicy(max_queue_size=4)),
    RequestQueue(levels=2, default_level=2),
], ids=["timeout", "max_queue_size", "priorities"])
def test_a_queue_policy_keeps_requests_queued_until_an_instance_is_free(queue):
    """Pipelining (a pool of depth 2) would send the next batch behind the running one, out of
    the policy's reach; with a policy it stays queued."""
    async def main():
        h = Harness(depth=2, queue=queue)
        await h.block()
        _waiting = h.submit("next", priority=1)  # held: the loop keeps only weak refs to tasks
        await settle()
        assert h.inst.seen == [["blocker"]] and h.stats.pending == 1
        h.inst.finish()
        await settle()
        assert h.inst.seen == [["blocker"], ["next"]]
    run(main())


def test_a_timeout_shorter_than_the_running_batch_rejects_on_time_with_pipelining():
    async def main():
        policy = QueuePolicy(timeout_ns=3_000_000 * US, allow_timeout_override=True)
        h = Harness(depth=2, queue=RequestQueue(default_policy=policy))
        await h.block()
        short = h.submit("short", timeout_us=100_000)
        default = h.submit("default", shape=(1, 5))
        await settle()
        h.timer.advance(100_000 * US)
        await settle()
        assert short.done()
        with pytest.raises(QueueRejection, match="^Request timeout expired$"):
            await short
        assert not default.done()
        h.timer.advance(2_900_000 * US)
        await settle()
        assert default.done()
        with pytest.raises(QueueRejection, match="^Request timeout expired$"):
            await default
        h.inst.finish()
        await settle()
        assert h.inst.seen == [["blocker"]]
    run(main())


def test_without_a_policy_the_next_batch_still_pipelines():
    async def main():
        h = Harness(depth=2)
        await h.block()
        h.submit("next")
        await settle()
        assert h.inst.seen == [["blocker"], ["next"]]
    run(main())


def test_timeout_override_may_lower_but_not_raise_the_default():
    policy = QueuePolicy(timeout_ns=1000 * US, allow_timeout_override=True)
    assert policy.timeout_for(200) == 200 * US
    assert policy.timeout_for(5000) == 1000 * US
    assert policy.timeout_for(0) == 1000 * US
    assert QueuePolicy(timeout_ns=1000 * US).timeout_for(200) == 1000 * US
    assert QueuePolicy(allow_timeout_override=True).timeout_for(300) == 0


def test_request_timeout_parameter_applies_when_overriding_is_allowed():
    async def main():
        policy = QueuePolicy(timeout_ns=10_000 * US, allow_timeout_override=True)
        h = Harness(queue=RequestQueue(default_policy=policy))
        await h.block()
        waiting = h.submit("t", timeout_us=100)
        patient = h.submit("p")
        await settle()
        h.timer.advance(100 * US)
        await settle()
        with pytest.raises(QueueRejection):
            await waiting
        assert not patient.done()
    run(main())


def test_delay_action_moves_a_timed_out_request_behind_its_level():
    async def main():
        policy = QueuePolicy(timeout_ns=100 * US, delay_on_timeout=True)
        h = Harness(max_batch_size=1, queue=RequestQueue(default_policy=policy))
        await h.block()
        h.submit("old")
        await settle()
        h.timer.advance(100 * US)  # "old" timed out: delayed, not rejected
        h.submit("new")
        await settle()
        for _ in range(3):
            h.inst.finish()
            await settle()
        assert h.inst.seen[1:] == [["new"], ["old"]]
    run(main())


def test_preserve_ordering_holds_answers_until_earlier_ones_left():
    async def main():
        h = Harness(instances=2, max_batch_size=1, preserve_ordering=True)
        first = h.submit("first")
        second = h.submit("second")
        await settle()
        a, b = h.instances
        assert a.seen == [["first"]] and b.seen == [["second"]]
        b.finish()
        await settle()
        assert not second.done()  # done, but "first" has not left yet
        a.finish()
        await settle()
        assert first.done() and second.done()
        assert (await second)[0].parameters == {"id": "second"}
    run(main())


def test_without_preserve_ordering_answers_leave_as_batches_end():
    async def main():
        h = Harness(instances=2, max_batch_size=1)
        first = h.submit("first")
        second = h.submit("second")
        await settle()
        h.instances[1].finish()
        await settle()
        assert second.done() and not first.done()
        h.instances[0].finish()
    run(main())


def test_two_instances_run_two_batches_at_once():
    async def main():
        h = Harness(instances=2, max_batch_size=2)
        for i in range(4):
            h.submit(f"r{i}")
        await settle()
        assert [len(i.running) for i in h.instances] == [1, 1]
    run(main())


def test_a_cancelled_caller_leaves_the_queue():
    async def main():
        h = Harness(preserve_ordering=True)
        await h.block()
        gone = h.submit("gone")
        stays = h.submit("stays")
        await settle()
        gone.cancel()
        await settle()
        assert h.stats.pending == 1
        h.inst.finish()
        await settle()
        assert h.inst.seen[1] == ["stays"]
        h.inst.finish()
        await settle()
        assert stays.done()
    run(main())


def test_outputs_of_a_caller_gone_during_execution_are_released():
    async def main():
        h = Harness()
        released = []
        task = h.submit("r")
        await settle()
        task.cancel()
        await settle()
        batch, future = h.inst.running.pop()
        future.set_result(([WorkResponse(None, release=lambda: released.append(1))],
                           BatchTimings()))
        await settle()
        assert released == [1]
        assert h.pool.has_room()
    run(main())


def test_a_failed_batch_fails_each_request_and_frees_the_instance():
    async def main():
        h = Harness()
        await h.block()
        tasks = [h.submit("a"), h.submit("b")]
        await settle()
        h.inst.finish()
        await settle()
        _, future = h.inst.running.pop()
        future.set_exception(ServerError(__import__("shmserve.errors").errors.Code.INTERNAL, "boom"))
        await settle()
        for t in tasks:
            with pytest.raises(ServerError, match="boom"):
                await t
        assert h.pool.has_room()
    run(main())


class CapAtTwo:
    """A strategy that lets at most two requests into a batch."""

    def __init__(self):
        self.started = self.ended = 0

    def start_batch(self):
        self.started += 1
        return {"n": 0}

    def include(self, state, work, batch_size, priority):
        state["n"] += 1
        return state["n"] <= 2

    def end_batch(self, state):
        self.ended += 1

    def close(self):
        pass


def test_custom_strategy_decides_who_joins():
    async def main():
        strategy = CapAtTwo()
        h = Harness(strategy=strategy)
        await h.block()
        for i in range(5):
            h.submit(f"r{i}")
        await settle()
        for _ in range(3):
            h.inst.finish()
            await settle()
        assert [len(b) for b in h.inst.seen[1:]] == [2, 2, 1]
        assert strategy.started == strategy.ended > 0
    run(main())


def test_close_fails_queued_requests():
    async def main():
        h = Harness()
        await h.block()
        waiting = h.submit("w")
        await settle()
        h.batcher.close()
        with pytest.raises(ServerError, match="unloaded"):
            await waiting
        assert h.stats.pending == 0
    run(main())


def test_a_batch_refused_at_once_fails_alone_and_the_next_one_runs():
    async def main():
        h = Harness()
        h.inst.refuse = ServerError(Code.UNAVAILABLE, "model instance 'inst_0' is not available")
        refused = h.submit("a")
        await settle()
        with pytest.raises(ServerError) as e:
            await refused
        assert e.value.code == Code.UNAVAILABLE
        h.inst.refuse = None
        served = h.submit("b")
        await settle()
        h.inst.finish()
        response, _, _ = await served
        assert response.parameters == {"id": "b"}
    run(main())
