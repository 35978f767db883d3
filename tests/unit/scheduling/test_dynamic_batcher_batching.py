"""The dynamic batcher against fake instances and a fake clock: batches form as Triton's do.
Queued requests join one batch when the instance frees, up to max_batch_size and the preferred
sizes; the queue delay holds a partial batch; a batch queues behind a running one (pipelining)
once it is as large; shapes batch only when alike or ragged; a custom strategy decides who
joins."""

import asyncio

from shmserve import eager
from tests.unit.scheduling.batcher_helpers import US, Harness, run, settle, work


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
