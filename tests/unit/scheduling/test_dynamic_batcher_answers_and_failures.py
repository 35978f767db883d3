"""The dynamic batcher's answers against fake instances: preserve_ordering, two instances at
once, a caller cancelled while queued or while its batch runs, a failed batch, close, and a
batch an instance refuses at once."""

import pytest

from shmserve.dispatch.work_types import BatchTimings, WorkResponse
from shmserve.errors import Code, ServerError
from tests.unit.scheduling.batcher_helpers import Harness, run, settle


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
