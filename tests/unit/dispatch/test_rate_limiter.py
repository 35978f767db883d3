"""The rate limiter (--rate-limit=execution_count) through instance pools of fake instances:
resources shared across models, per device or global, copies given on the command line, and
the priority of waiting instances."""

import pytest

from shmserve import proto
from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.rate_limiter import Needs, RateLimiter, needs_of, parse_resource
from google.protobuf import text_format


class Instance:
    def __init__(self, name):
        self.instance_name = name
        self.alive = True


def group(text: str):
    config = proto.ModelConfig()
    text_format.Parse(f"instance_group [ {{ {text} }} ]", config)
    return config.instance_group[0]


def limited(limiter, names, resources, priority=1, device=0):
    """A pool of instances that each need `resources` ({name: count}; a name ending in '*' is
    global)."""
    instances = [Instance(n) for n in names]
    needs = Needs(tuple(((r.rstrip("*"), "GLOBAL" if r.endswith("*") else device), c)
                        for r, c in resources.items()), priority)
    for inst in instances:
        limiter.add(inst, needs)
    return InstancePool(instances, limiter=limiter), instances


def test_needs_come_from_the_instance_group():
    g = group('count: 1 kind: KIND_GPU rate_limiter { resources [ { name: "R" count: 2 }, '
              '{ name: "G" global: true count: 3 }, { name: "Z" count: 0 } ] priority: 2 }')
    assert needs_of(g, 1) == Needs(((("R", 1), 2), (("G", "GLOBAL"), 3)), 2)
    assert needs_of(group("count: 1"), 0) is None
    assert needs_of(group('rate_limiter { resources [ { name: "R" count: 1 } ] }'), 0).priority == 1


def test_parse_resource():
    assert parse_resource("R1:10") == ("R1", 10, None)
    assert parse_resource("R2:5:1") == ("R2", 5, 1)
    for bad in ("R", "R:x", ":3", "R:1:2:3", "R:-1"):
        with pytest.raises(ValueError):
            parse_resource(bad)


def test_models_sharing_a_resource_run_one_at_a_time():
    limiter = RateLimiter()
    pool_a, (a,) = limited(limiter, ["a"], {"R": 1})
    pool_b, (b,) = limited(limiter, ["b"], {"R": 1})
    woken = []
    pool_b.add_listener(lambda: woken.append("b"))
    assert pool_a.try_acquire() is a
    assert pool_a.try_acquire() is None  # one batch at a time while it holds resources
    assert pool_b.try_acquire() is None and not pool_b.has_room()
    pool_a.release(a)
    assert woken  # b's scheduler is told that it may run now
    assert pool_b.try_acquire() is b
    assert pool_a.try_acquire() is None
    pool_b.release(b)
    assert pool_a.try_acquire() is a


def test_copies_default_to_the_largest_need_and_the_command_line_overrides():
    limiter = RateLimiter()
    pool_a, (a,) = limited(limiter, ["a"], {"R": 4})
    pool_b, (b,) = limited(limiter, ["b"], {"R": 1})
    assert pool_b.try_acquire() is b
    assert pool_a.try_acquire() is None  # 1 + 4 > 4 copies
    pool_b.release(b)
    assert pool_a.try_acquire() is a
    given = RateLimiter([("R", 5, None)])
    pool_a, (a,) = limited(given, ["a"], {"R": 4})
    pool_b, (b,) = limited(given, ["b"], {"R": 1})
    assert pool_a.try_acquire() is a and pool_b.try_acquire() is b


def test_per_device_and_global_resources():
    limiter = RateLimiter([("R", 1, 1)])  # device 1 has one copy; device 0 the default (1)
    pool_0, (on_0,) = limited(limiter, ["d0"], {"R": 1}, device=0)
    pool_1, (on_1,) = limited(limiter, ["d1"], {"R": 1}, device=1)
    assert pool_0.try_acquire() is on_0 and pool_1.try_acquire() is on_1  # separate copies
    shared = RateLimiter([("G", 1, 7)])  # a device given for a global resource is ignored
    pool_0, (on_0,) = limited(shared, ["d0"], {"G*": 1}, device=0)
    pool_1, (on_1,) = limited(shared, ["d1"], {"G*": 1}, device=1)
    assert pool_0.try_acquire() is on_0 and pool_1.try_acquire() is None


def test_waiting_instances_take_turns_by_executions_times_priority():
    limiter = RateLimiter()
    holder_pool, (holder,) = limited(limiter, ["holder"], {"R": 1})
    fast_pool, (fast,) = limited(limiter, ["fast"], {"R": 1}, priority=1)
    slow_pool, (slow,) = limited(limiter, ["slow"], {"R": 1}, priority=2)
    runs = []

    def runner(pool, name):
        def on_room():
            inst = pool.try_acquire()
            if inst is not None:
                runs.append(name)
        return on_room

    fast_pool.add_listener(runner(fast_pool, "fast"))
    slow_pool.add_listener(runner(slow_pool, "slow"))
    assert holder_pool.try_acquire() is holder
    assert fast_pool.try_acquire() is None and slow_pool.try_acquire() is None  # both wait
    holder_pool.release(holder)
    for _ in range(30):  # whoever ran gives back and asks again at once
        last = fast if runs[-1] == "fast" else slow
        pool = fast_pool if last is fast else slow_pool
        assert pool.try_acquire() is None  # it waits behind the other
        pool.release(last)
    assert runs.count("fast") == pytest.approx(2 * runs.count("slow"), abs=2)


def test_unloading_gives_back_what_was_held():
    limiter = RateLimiter()
    pool_a, (a,) = limited(limiter, ["a"], {"R": 1})
    pool_b, (b,) = limited(limiter, ["b"], {"R": 1})
    assert pool_a.try_acquire() is a
    pool_a.close()
    assert pool_b.try_acquire() is b
    pool_b.instance_back(b)  # a restart drops the batches it held
    assert pool_b.try_acquire() is b


def test_instances_without_resources_are_not_limited():
    limiter = RateLimiter()
    free = Instance("free")
    pool = InstancePool([free], limiter=limiter)
    assert pool.try_acquire() is free and pool.try_acquire() is free  # pipelined as usual
