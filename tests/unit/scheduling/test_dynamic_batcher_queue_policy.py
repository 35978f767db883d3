"""The dynamic batcher's queue against fake instances and a fake clock: priority levels, the
queue policies (maximum size, timeouts, their override by a request, the delay action) per
level, and a policy keeping requests queued rather than pipelined behind a running batch."""

import pytest

from shmserve.scheduling.queue import QueuePolicy, QueueRejection, RequestQueue
from tests.unit.scheduling.batcher_helpers import US, Harness, run, settle, work


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
