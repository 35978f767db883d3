"""eager.start: a coroutine's first step runs at once, the rest in a task that behaves like
one made by create_task (results, exceptions, cancellation)."""

import asyncio

import pytest

from shmserve import eager


def run(coro_fn):
    return asyncio.run(coro_fn())


def test_a_coroutine_that_never_waits_ends_in_the_call_without_a_task():
    steps = []

    async def handler():
        steps.append("ran")
        return 42

    async def main():
        ended = eager.start(handler(), asyncio.get_running_loop())
        assert steps == ["ran"]
        assert ended.done() and ended.result() == 42
        assert not isinstance(ended, asyncio.Task)

    run(main)


def test_what_the_first_step_raises_is_held_by_the_future():
    async def handler():
        raise ValueError("bad request")

    async def main():
        ended = eager.start(handler(), asyncio.get_running_loop())
        with pytest.raises(ValueError, match="bad request"):
            ended.result()

    run(main)


def test_the_first_step_runs_before_start_returns_and_the_rest_after_the_wait():
    steps = []

    async def handler(gate):
        steps.append("before")
        value = await gate
        steps.append("after")
        return value + 1

    async def main():
        loop = asyncio.get_running_loop()
        gate = loop.create_future()
        task = eager.start(handler(gate), loop)
        assert steps == ["before"]  # no turn of the loop was needed
        assert isinstance(task, asyncio.Task) and not task.done()
        await asyncio.sleep(0)
        assert steps == ["before"]  # still waiting on the gate
        gate.set_result(1)
        assert await task == 2
        assert steps == ["before", "after"]

    run(main)


def test_a_gate_resolved_before_the_task_first_runs_is_not_missed():
    async def handler(gate):
        return await gate

    async def main():
        loop = asyncio.get_running_loop()
        gate = loop.create_future()
        task = eager.start(handler(gate), loop)
        gate.set_result("early")
        assert await task == "early"

    run(main)


@pytest.mark.parametrize("after_first_task_step", [False, True])
def test_cancelling_cancels_what_it_waits_on_and_the_coroutine_sees_it(after_first_task_step):
    seen = []

    async def handler(gate):
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main():
        loop = asyncio.get_running_loop()
        gate = loop.create_future()
        task = eager.start(handler(gate), loop)
        if after_first_task_step:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Whoever would resolve the gate sees that nobody wants the result.
        assert gate.cancelled()
        assert seen == ["cancelled"]

    run(main)


def test_a_bare_yield_and_the_current_task_after_the_first_wait():
    async def handler():
        await asyncio.sleep(0)
        return asyncio.current_task()

    async def main():
        task = eager.start(handler(), asyncio.get_running_loop())
        assert await task is task

    run(main)


def test_an_exception_after_the_first_wait_ends_the_task_with_it():
    async def handler(gate):
        await gate
        raise KeyError("late")

    async def main():
        loop = asyncio.get_running_loop()
        gate = loop.create_future()
        task = eager.start(handler(gate), loop)
        gate.set_result(None)
        with pytest.raises(KeyError):
            await task

    run(main)
