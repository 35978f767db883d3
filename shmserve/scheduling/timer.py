"""The schedulers' notion of time, so that tests can drive batching with a fake clock."""

import asyncio
import time


class LoopTimer:
    """Monotonic nanoseconds, and callbacks at a given time on the running event loop."""

    now_ns = staticmethod(time.monotonic_ns)  # the builtin itself: called for every request

    @staticmethod
    def call_at(when_ns: int, callback) -> asyncio.TimerHandle:
        """Returns a handle with cancel(). uvloop rounds timers to milliseconds, so a callback
        may run early: callers re-check the time rather than trust that it has come."""
        delay = max(0, when_ns - time.monotonic_ns()) / 1e9
        return asyncio.get_running_loop().call_later(delay, callback)


class Alarm:
    """A scheduler's one pending wake-up (the end of a queue delay): setting it again moves it."""

    __slots__ = ("_timer", "_callback", "_handle", "_when")

    def __init__(self, timer, callback):
        self._timer = timer
        self._callback = callback
        self._handle = None
        self._when = 0

    def set(self, when_ns: int) -> None:
        if self._handle is not None:
            if self._when == when_ns:
                return
            self._handle.cancel()
        self._when = when_ns
        self._handle = self._timer.call_at(when_ns, self._ring)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _ring(self) -> None:
        self._handle = None
        self._callback()
