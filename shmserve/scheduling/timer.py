"""The schedulers' notion of time, so that tests can drive batching with a fake clock."""

import asyncio
import time


class LoopTimer:
    """Monotonic nanoseconds, and callbacks at a given time on the running event loop."""

    @staticmethod
    def now_ns() -> int:
        return time.monotonic_ns()

    @staticmethod
    def call_at(when_ns: int, callback) -> asyncio.TimerHandle:
        """Returns a handle with cancel(). uvloop rounds timers to milliseconds, so a callback
        may run early: callers re-check the time rather than trust that it has come."""
        delay = max(0, when_ns - time.monotonic_ns()) / 1e9
        return asyncio.get_running_loop().call_later(delay, callback)
