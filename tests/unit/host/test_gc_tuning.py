"""GcTuner: requests no longer trigger young collections, a timer collects instead, and
stopping gives the process its own settings back."""

import asyncio
import gc
import weakref

import pytest

from shmserve.host.gc_tuning import GcTuner


@pytest.fixture(autouse=True)
def own_settings():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)
    gc.unfreeze()


class Cyclic:
    def __init__(self):
        self.me = self


def garbage_cycle() -> weakref.ref:
    """A weak reference to an object only a reference cycle keeps alive."""
    return weakref.ref(Cyclic())


def test_start_raises_only_the_young_threshold_and_stop_restores_it():
    gc.set_threshold(700, 11, 12)
    tuner = GcTuner(young_threshold=12_345)

    async def run():
        tuner.start(asyncio.get_running_loop())
        assert gc.get_threshold() == (12_345, 11, 12)
        assert gc.get_freeze_count() > 0  # what startup built is out of the collector's sight
        tuner.stop()

    asyncio.run(run())
    assert gc.get_threshold() == (700, 11, 12)


def test_stop_without_start_leaves_the_settings():
    gc.set_threshold(700, 10, 10)
    GcTuner().stop()
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("sweep_s, collected", [(0.02, True), (60.0, False)])
def test_garbage_cycles_wait_for_the_sweep_not_for_the_threshold(sweep_s, collected):
    # No request-sized burst of objects reaches this threshold: only the timer collects.
    tuner = GcTuner(young_threshold=10_000_000, sweep_s=sweep_s)

    async def run():
        tuner.start(asyncio.get_running_loop())
        try:
            ref = garbage_cycle()
            assert ref() is not None
            await asyncio.sleep(0.2)
            return ref() is None
        finally:
            tuner.stop()

    assert asyncio.run(run()) is collected


def test_every_few_sweeps_collect_everything():
    generations = []

    def record(phase, info):
        if phase == "start":
            generations.append(info["generation"])

    tuner = GcTuner(young_threshold=10_000_000, sweep_s=0.01, full_every=3)

    async def run():
        tuner.start(asyncio.get_running_loop())
        gc.callbacks.append(record)
        try:
            while len(generations) < 6:
                await asyncio.sleep(0.01)
        finally:
            gc.callbacks.remove(record)
            tuner.stop()

    asyncio.run(run())
    assert generations[:6] == [1, 1, 2, 1, 1, 2]


async def collections_during(seconds: float) -> list:
    """The generations collected meanwhile, with the interpreter's own collections off."""
    gc.set_threshold(10_000_000)
    collected = []

    def record(phase, info):
        if phase == "start":
            collected.append(info["generation"])

    gc.callbacks.append(record)
    try:
        await asyncio.sleep(seconds)
    finally:
        gc.callbacks.remove(record)
    return collected


def test_a_stopped_tuner_sweeps_no_more():
    tuner = GcTuner(young_threshold=10_000_000, sweep_s=0.01)

    async def run():
        tuner.start(asyncio.get_running_loop())
        tuner.stop()
        return await collections_during(0.1)

    assert asyncio.run(run()) == []


def test_a_second_start_keeps_one_timer_and_the_thresholds_to_restore():
    gc.set_threshold(700, 10, 10)
    tuner = GcTuner(young_threshold=10_000_000, sweep_s=0.01)

    async def run():
        loop = asyncio.get_running_loop()
        tuner.start(loop)
        tuner.start(loop)
        tuner.stop()
        assert gc.get_threshold() == (700, 10, 10)
        return await collections_during(0.1)

    assert asyncio.run(run()) == []
