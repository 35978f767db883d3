"""The sequence batcher against fake instances and a fake clock: slots, backlog, idle timeout,
null requests, the oldest strategy and iterative rescheduling."""

import asyncio

import pytest

from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.work_types import BatchTimings, WorkInput, WorkRequest, WorkResponse
from shmserve.errors import Code, ServerError
from shmserve.observability.stats import ModelStats
from shmserve.scheduling.sequence import SequenceBatcher
from tests.unit.scheduling.batcher_helpers import FakeTimer, settle

START, END = 1, 2
MS = 1_000_000  # ns


class SlotInstance:
    """Holds each batch until the test finishes it; records (correlation id, slot, ready,
    flags) per request."""

    def __init__(self, name):
        self.instance_name = name
        self.alive = True
        self.running = []
        self.seen = []

    def execute(self, batch):
        """As a WorkerHandle: the batch leaves at once, its answer comes later."""
        future = asyncio.get_running_loop().create_future()
        self.running.append((batch, future))
        self.seen.append([(r.correlation_id, r.sequence_slot, r.ready, r.flags) for r in batch])
        return future

    def finish(self, reschedule=()):
        """Answer the oldest running batch; requests whose correlation id is in `reschedule`
        ask to run again."""
        batch, future = self.running.pop(0)
        responses = []
        for r in batch:
            response = WorkResponse(None, parameters={"id": r.correlation_id})
            response.rescheduled = r.correlation_id in reschedule
            responses.append(response)
        future.set_result((responses, BatchTimings(1, 2, 3)))


class Harness:
    def __init__(self, instances=1, depth=1, slots=2, **kwargs):
        self.timer = FakeTimer()
        self.instances = [SlotInstance(f"inst_{i}") for i in range(instances)]
        self.pool = InstancePool(self.instances, depth=depth)
        self.stats = ModelStats()
        kwargs.setdefault("max_batch_size", slots)
        self.batcher = SequenceBatcher(self.pool, self.stats, model_name="acc",
                                       slots_per_instance=slots, timer=self.timer, **kwargs)
        self.inst = self.instances[0]

    def submit(self, corrid, flags=0, batch_size=1):
        request = WorkRequest(f"r{corrid}", corrid, flags, {},
                              [WorkInput("INPUT", "INT32", [1, 1], b"\x01\x00\x00\x00")], ["OUTPUT"])
        return asyncio.ensure_future(self.batcher.submit(request, batch_size))


def run(coro):
    asyncio.run(coro)


def test_each_sequence_keeps_its_slot_and_idle_slots_get_null_requests():
    async def main():
        h = Harness(slots=3)
        a1 = h.submit(11, START)
        b1 = h.submit(22, START)
        await settle()
        assert h.inst.seen == [[(11, 0, True, START), (22, 1, True, START)]]
        h.inst.finish()
        await settle()
        assert (await a1)[0].parameters == {"id": 11} and (await b1)[0].parameters == {"id": 22}
        b2 = h.submit(22)  # slot 0 has nothing queued: a null request holds its place
        await settle()
        assert h.inst.seen[1] == [(0, 0, False, 0), (22, 1, True, 0)]
        h.inst.finish()
        assert (await b2)[0].parameters == {"id": 22}
    run(main())


def test_a_sequence_runs_one_request_per_batch_in_order():
    async def main():
        h = Harness(slots=2, depth=2)
        futures = [h.submit(5, START), h.submit(5), h.submit(5, END)]
        await settle()
        # Pipelined batches of one instance run in order, one request of the sequence each.
        assert h.inst.seen == [[(5, 0, True, START)], [(5, 0, True, 0)]]
        h.inst.finish()
        await settle()
        assert h.inst.seen[2] == [(5, 0, True, END)]
        h.inst.finish()
        h.inst.finish()
        for f in futures:
            await f
    run(main())


def test_requests_that_break_the_sequence_rules_are_refused():
    async def main():
        h = Harness()
        with pytest.raises(ServerError) as missing:
            await h.submit(0, START)
        assert missing.value.code == Code.INVALID_ARG
        assert missing.value.message == ("inference request to model 'acc' must specify a "
                                         "non-zero or non-empty correlation ID")
        with pytest.raises(ServerError) as empty:
            await h.submit("", START)
        assert "non-empty correlation ID" in empty.value.message
        with pytest.raises(ServerError) as no_start:
            await h.submit(7)
        assert no_start.value.message == ("inference request for sequence 7 to model 'acc' must "
                                          "specify the START flag on the first request of the "
                                          "sequence")
        with pytest.raises(ServerError) as batched:
            await h.submit(8, START, batch_size=2)
        assert batched.value.message == ("inference request to model 'acc' must specify "
                                         "batch-size 1 due to requirements of sequence batcher")
        assert h.stats.pending == 0
    run(main())


def test_string_and_integer_ids_are_different_sequences():
    async def main():
        h = Harness(slots=2)
        h.submit(1, START)
        h.submit("1", START)
        await settle()
        assert h.inst.seen == [[(1, 0, True, START), ("1", 1, True, START)]]
    run(main())


def test_new_sequences_wait_in_the_backlog_until_an_end_frees_a_slot():
    async def main():
        h = Harness(slots=1)
        a = h.submit(1, START)
        b = h.submit(2, START)  # no slot: backlog
        b_end = h.submit(2, END)
        c = h.submit(3, START)
        await settle()
        assert h.inst.seen == [[(1, 0, True, START)]]
        h.inst.finish()
        await a
        await settle()
        assert len(h.inst.seen) == 1  # sequence 1 still holds the slot
        a_end = h.submit(1, END)
        await settle()
        assert h.inst.seen[1] == [(1, 0, True, END)]
        h.inst.finish()
        await a_end
        await settle()
        # The backlog's first sequence took the slot; the next waits its turn.
        assert h.inst.seen[2] == [(2, 0, True, START)]
        h.inst.finish()
        await settle()
        assert h.inst.seen[3] == [(2, 0, True, END)]
        h.inst.finish()
        await settle()
        assert h.inst.seen[4] == [(3, 0, True, START)]
        h.inst.finish()
        for f in (b, b_end, c):
            await f
    run(main())


def test_an_idle_sequence_loses_its_slot_and_must_start_again():
    async def main():
        h = Harness(slots=1, idle_ns=5 * MS)
        first = h.submit(1, START)
        await settle()
        h.inst.finish()
        await first
        waiting = h.submit(2, START)  # backlog
        await settle()
        h.timer.advance(4 * MS)
        await settle()
        assert len(h.inst.seen) == 1
        h.timer.advance(2 * MS)  # sequence 1 idle for 6 ms: its slot goes to sequence 2
        await settle()
        assert h.inst.seen[1] == [(2, 0, True, START)]
        h.inst.finish()
        await waiting
        with pytest.raises(ServerError) as late:
            await h.submit(1)
        assert "must specify the START flag" in late.value.message
    run(main())


def test_sequences_spread_over_instances_first():
    async def main():
        h = Harness(instances=2, slots=2)
        h.submit(1, START)
        h.submit(2, START)
        h.submit(3, START)
        await settle()
        a, b = h.instances
        assert a.seen == [[(1, 0, True, START), (3, 1, True, START)]]
        assert b.seen == [[(2, 0, True, START)]]
    run(main())


def test_direct_waits_for_minimum_slot_utilization_up_to_the_queue_delay():
    async def main():
        h = Harness(slots=4, max_queue_delay_ns=3 * MS, minimum_slot_utilization=0.5)
        h.submit(1, START)
        await settle()
        assert h.inst.seen == []
        h.timer.advance(3 * MS)
        await settle()
        assert h.inst.seen == [[(1, 0, True, START)]]
        h.inst.finish()
        await settle()
        h.submit(1)
        h.submit(2, START)  # two of four slots ready: no waiting
        await settle()
        assert h.inst.seen[1] == [(1, 0, True, 0), (2, 1, True, START)]
    run(main())


def test_oldest_batches_the_oldest_heads_without_null_requests():
    async def main():
        h = Harness(slots=4, oldest=True, max_batch_size=2)
        for corrid in (1, 2, 3):
            h.submit(corrid, START)
        await settle()
        # Two at most per batch, oldest first; the third waits for the instance.
        assert h.inst.seen == [[(1, 0, True, START), (2, 1, True, START)]]
        h.timer.advance(1000)
        h.submit(1)
        await settle()
        h.inst.finish()
        await settle()
        assert h.inst.seen[1] == [(3, 2, True, START), (1, 0, True, 0)]
    run(main())


def test_oldest_holds_a_partial_batch_for_the_queue_delay():
    async def main():
        h = Harness(slots=4, oldest=True, max_batch_size=4, max_queue_delay_ns=2 * MS,
                    preferred_sizes=[2])
        h.submit(1, START)
        await settle()
        assert h.inst.seen == []
        h.submit(2, START)  # a preferred size: leaves at once
        await settle()
        assert h.inst.seen == [[(1, 0, True, START), (2, 1, True, START)]]
    run(main())


def test_iterative_requests_are_rescheduled_and_finished_ones_free_their_slot():
    async def main():
        h = Harness(slots=2, iterative=True)
        long = h.submit(0)
        short = h.submit(0)
        waiting = h.submit(0)  # no slot yet
        await settle()
        # Each request got its own id and START.
        assert h.inst.seen == [[(1, 0, True, START), (2, 1, True, START)]]
        h.inst.finish(reschedule={1, 2})
        await settle()
        assert h.inst.seen[1] == [(1, 0, True, 0), (2, 1, True, 0)]
        h.inst.finish(reschedule={1})  # the short one is done
        assert (await short)[0].parameters == {"id": 2}
        await settle()
        # Its slot went at once to the waiting request, which joins the running one.
        assert h.inst.seen[2] == [(1, 0, True, 0), (3, 1, True, START)]
        h.inst.finish()
        assert (await long)[0].parameters == {"id": 1}
        assert (await waiting)[0].parameters == {"id": 3}
        assert h.stats.pending == 0
        # As in Triton, each step that a request goes on from counts as an inference and a
        # success (three here); the last step of each is the dataplane's to record.
        assert (h.stats.execution_count, h.stats.inference_count) == (3, 3)
        assert h.stats.success.count == h.stats.queue.count == h.stats.compute_infer.count == 3
        assert h.stats.compute_infer.ns == 3 * 2
    run(main())


def test_a_request_cancelled_while_queued_leaves_its_sequence():
    async def main():
        h = Harness(slots=1)
        h.submit(1, START)
        second = h.submit(1)
        third = h.submit(1, END)
        await settle()
        second.cancel()
        await settle()
        h.inst.finish()
        await settle()
        assert h.inst.seen[1] == [(1, 0, True, END)]
        h.inst.finish()
        await third
        assert h.stats.pending == 0
    run(main())


def test_close_fails_what_is_queued():
    async def main():
        h = Harness(slots=1)
        h.submit(1, START)
        queued = h.submit(2, START)
        await settle()
        h.batcher.close()
        with pytest.raises(ServerError) as closed:
            await queued
        assert closed.value.code == Code.UNAVAILABLE
    run(main())


def test_an_iterative_instance_runs_one_step_at_a_time_so_new_requests_join_the_next():
    async def main():
        h = Harness(slots=4, depth=2, iterative=True)
        running = h.submit(0)
        await settle()
        joining = h.submit(0)
        await settle()
        assert len(h.inst.seen) == 1  # no second batch beside the running step
        h.inst.finish(reschedule={1})
        await settle()
        assert h.inst.seen[1] == [(1, 0, True, 0), (2, 1, True, START)]
        h.inst.finish()
        await running
        await joining
    run(main())


def test_an_added_instance_gives_a_backlog_sequence_its_slot():
    async def main():
        h = Harness(slots=1)
        h.submit(1, START)
        waiting = h.submit(2, START)  # no slot: backlog
        await settle()
        added = SlotInstance("added")
        h.pool.update([h.inst, added])
        h.batcher.add_instances([added])
        await settle()
        assert added.seen == [[(2, 0, True, START)]]
        added.finish()
        await waiting
    run(main())


def test_a_retired_instance_keeps_its_sequences_until_they_end_and_takes_no_new_one():
    async def main():
        h = Harness(instances=2, slots=2)
        old, kept = h.instances
        first = h.submit(1, START)  # old, slot 0
        await settle()
        old.finish()
        await first
        h.batcher.retire_instances(h.pool.update([kept]))
        assert h.batcher.holds_sequences(old) and not h.batcher.holds_sequences(kept)
        # old's free slot is gone: new sequences go to kept, then wait.
        h.submit(2, START)
        h.submit(3, START)
        waiting = h.submit(4, START)
        following = h.submit(1)
        await settle()
        assert old.seen[1] == [(1, 0, True, 0)]  # sequence 1 goes on where it began
        assert kept.seen == [[(2, 0, True, START), (3, 1, True, START)]]
        old.finish()
        await following
        end = h.submit(1, END)
        await settle()
        assert old.seen[2] == [(1, 0, True, END)]
        assert not h.batcher.holds_sequences(old)  # its last sequence ended: it may stop
        old.finish()
        await end
        await settle()
        assert len(old.seen) == 3 and not waiting.done()  # its slot went with it
        kept.finish()
        h.submit(2, END)
        await settle()
        kept.finish()
        await settle()
        assert kept.seen[-1][0] == (4, 0, True, START)  # sequence 2's slot
        kept.finish()
        await waiting
    run(main())
