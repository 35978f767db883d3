"""Instance pool: least-loaded choice, pipelining depth, waiting, dead instances."""

import asyncio

import pytest

from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.work_types import BatchTimings
from shmserve.errors import Code, ServerError
from shmserve.observability.stats import ModelStats
from shmserve.scheduling.default import DefaultScheduler


class FakeInstance:
    def __init__(self, name):
        self.instance_name = name
        self.alive = True
        self.batches = []

    async def execute(self, batch):
        self.batches.append(batch)
        await asyncio.sleep(0)
        return [Response(f"{self.instance_name}:{r}") for r in batch], BatchTimings()


class Response:
    def __init__(self, text, release=None):
        self.text = text
        self.release = release


def run(coro):
    return asyncio.run(coro)


def test_least_loaded_instance_first():
    async def go():
        a, b = FakeInstance("a"), FakeInstance("b")
        pool = InstancePool([a, b], depth=2)
        got = [await pool.acquire() for _ in range(4)]
        assert [i.instance_name for i in got] == ["a", "b", "a", "b"]
        pool.release(b)
        assert await pool.acquire() is b
    run(go())


def test_waiters_are_served_in_order_when_full():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=1)
        first = await pool.acquire()
        order = []

        async def wait(tag):
            inst = await pool.acquire()
            order.append(tag)
            pool.release(inst)

        tasks = [asyncio.ensure_future(wait(t)) for t in "xyz"]
        await asyncio.sleep(0)
        assert order == []
        pool.release(first)
        await asyncio.gather(*tasks)
        assert order == ["x", "y", "z"]
    run(go())


def test_cancelled_waiter_passes_its_turn_on():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=1)
        held = await pool.acquire()
        w1 = asyncio.ensure_future(pool.acquire())
        w2 = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        pool.release(held)
        w1.cancel()
        assert await asyncio.wait_for(w2, 1) is a
    run(go())


def test_dead_instances_are_skipped_and_all_dead_is_unavailable():
    async def go():
        a, b = FakeInstance("a"), FakeInstance("b")
        pool = InstancePool([a, b], depth=1)
        a.alive = False
        assert await pool.acquire() is b
        b.alive = False
        with pytest.raises(ServerError) as e:
            await pool.acquire()
        assert e.value.code == Code.UNAVAILABLE
        assert not pool.ready
    run(go())


def test_waiter_wakes_when_instance_comes_back():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=1)
        await pool.acquire()
        waiter = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        pool.instance_back(a)  # restarted: its old batch failed, its load is reset
        assert await asyncio.wait_for(waiter, 1) is a
    run(go())


def test_default_scheduler_runs_each_request_alone():
    async def go():
        a, b = FakeInstance("a"), FakeInstance("b")
        stats = ModelStats()
        sched = DefaultScheduler(InstancePool([a, b]), stats)
        results = await asyncio.gather(*(sched.submit(i) for i in range(6)))
        assert sorted(r.text.split(":")[1] for r, _, _ in results) == [str(i) for i in range(6)]
        assert stats.execution_count == 6 and stats.pending == 0
        assert all(len(batch) == 1 for inst in (a, b) for batch in inst.batches)
        assert a.batches and b.batches  # both instances worked
    run(go())


def test_cancelled_caller_leaves_the_batch_running_and_releases_its_outputs():
    async def go():
        released = []
        gate = asyncio.Event()

        class Gated(FakeInstance):
            async def execute(self, batch):
                await gate.wait()
                return [Response("x", release=lambda: released.append(1))], BatchTimings()

        inst = Gated("g")
        pool = InstancePool([inst], depth=1)
        sched = DefaultScheduler(pool, ModelStats())
        caller = asyncio.ensure_future(sched.submit(0))
        await asyncio.sleep(0)
        caller.cancel()
        await asyncio.sleep(0)
        # Still running on the instance: the pool must not hand it out again yet.
        waiter = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        assert not waiter.done()
        gate.set()
        assert await asyncio.wait_for(waiter, 1) is inst
        assert released == [1]  # nobody copied the outputs out, so they were released
    run(go())


def test_an_instance_with_long_batches_holds_one_at_a_time():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=2, pipeline_below_us=1000)
        first = pool.try_acquire()
        assert pool.try_acquire() is a  # nothing known yet: pipelined
        pool.release(a, BatchTimings(0, 20_000_000, 0))  # a 20 ms batch
        assert not pool.has_room()  # the next forms when this one is done
        pool.release(first, BatchTimings(0, 20_000_000, 0))
        assert pool.try_acquire() is a and not pool.has_room()
        # One short batch and the estimate follows it: two at a time again.
        pool.release(a, BatchTimings(20_000, 50_000, 10_000))
        assert pool.try_acquire() is a and pool.try_acquire() is a
    run(go())


def test_a_batch_stretched_now_and_then_does_not_stop_pipelining():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=2, pipeline_below_us=1000)
        for _ in range(6):
            pool.try_acquire()
            pool.release(a, BatchTimings(0, 100_000, 0))
        pool.try_acquire()
        pool.release(a, BatchTimings(0, 5_000_000, 0))  # the worker lost its core mid-batch
        assert pool.try_acquire() is a and pool.try_acquire() is a
    run(go())


def test_pipelining_off_holds_one_batch_from_the_start():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=2, pipeline_below_us=0)
        assert pool.try_acquire() is a and not pool.has_room()
        pool.release(a, BatchTimings(0, 1_000, 0))
        assert pool.try_acquire() is a and not pool.has_room()
    run(go())


def test_a_busy_instance_takes_a_batch_no_smaller_than_its_latest():
    async def go():
        a = FakeInstance("a")
        pool = InstancePool([a], depth=2)
        assert pool.try_acquire(4, can_grow=True) is a
        assert pool.has_room()  # a second batch may queue behind the first...
        assert pool.try_acquire(3, can_grow=True) is None  # ...if it is as large
        assert pool.try_acquire(4, can_grow=True) is a and not pool.has_room()
        pool.release(a)
        assert pool.try_acquire(2) is a  # one that cannot grow goes as it is
        pool.release(a)
        pool.release(a)
        assert pool.try_acquire(1, can_grow=True) is a  # idle: any size
    run(go())


def test_update_adds_instances_and_retires_others_once_their_batches_end():
    """An instance group update: the new instance takes work at once, the retired one none,
    though the batch it holds runs on until it is released."""
    async def go():
        a, b, c = FakeInstance("a"), FakeInstance("b"), FakeInstance("c")
        pool = InstancePool([a, b], depth=1)
        assert await pool.acquire() is a
        assert pool.update([b, c]) == [a]
        assert pool.instances == [b, c] and pool.retiring == {a}
        assert pool.busy(a) and pool.all_alive
        assert {await pool.acquire(), await pool.acquire()} == {b, c}
        assert pool.try_acquire() is None  # a has no room for anyone any more
        pool.release(a)
        assert not pool.busy(a)
        pool.forget(a)
        assert pool.retiring == set()
        pool.release(a)  # a release that comes after it is forgotten changes nothing
        assert not pool.try_acquire_instance(a)
        pool.release(b)
        assert pool.try_acquire() is b
    run(go())


def test_added_instances_hold_one_batch_when_the_scheduler_asked_so():
    async def go():
        a, c = FakeInstance("a"), FakeInstance("c")
        pool = InstancePool([a], depth=2)
        pool.hold_one_batch()
        pool.update([a, c])
        assert pool.try_acquire_instance(c)
        assert not pool.try_acquire_instance(c)
    run(go())


def test_an_added_instance_that_the_rate_limiter_limits_makes_the_pool_obey_it():
    from shmserve.dispatch.rate_limiter import Needs, RateLimiter
    async def go():
        limiter = RateLimiter()
        needs = Needs(((("R", 0), 1),), 1)
        a, c, d = FakeInstance("a"), FakeInstance("c"), FakeInstance("d")
        limiter.add(d, needs)
        other = InstancePool([d], limiter=limiter)
        pool = InstancePool([a])  # built without the limiter: nothing of it was limited
        limiter.add(c, needs)
        pool.update([a, c], limiter=limiter)
        assert pool.try_acquire_instance(c)
        assert other.try_acquire() is None  # c holds the one copy of R
        pool.release(c)
        assert other.try_acquire() is d
        other.release(d)
        pool.update([a])
        pool.forget(c)
        assert not limiter.limits(c)
    run(go())
