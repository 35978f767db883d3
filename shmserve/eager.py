"""Starting a request's handler in the turn of the event loop that read the request.

A task runs its first step one turn of the loop after it was created, and under load a turn
holds many other callbacks: the request reaches its scheduler late, and misses batches it
could have joined. Python 3.12's eager tasks fix that; on 3.11 `start` runs the first step
itself, and hands the rest of the coroutine to an ordinary task that resumes it where it
waits. A handler that finishes in its first step (a health check, a refused request) costs no
task at all, only a finished future.

While the first step runs, the current task is the caller's (none in a protocol's callback):
code that needs its own task (`asyncio.current_task()`, `asyncio.timeout()`) must run after
the first await.
"""

import asyncio
import collections.abc


def start(coro, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """Run `coro` up to its first await now; returns the task that runs the rest or, when it
    ended in that first step, a future that holds what it returned or raised."""
    try:
        waiting_on = coro.send(None)
    except StopIteration as stop:
        ended = loop.create_future()
        ended.set_result(stop.value)
        return ended
    except asyncio.CancelledError:
        ended = loop.create_future()
        ended.cancel()
        return ended
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        ended = loop.create_future()
        ended.set_exception(exc)
        return ended
    return loop.create_task(_Resumed(coro, waiting_on))


_HANDED = object()


class _Resumed(collections.abc.Coroutine):
    """A coroutine suspended by `start`, seen by a task as a fresh one: the task's first
    step receives what the coroutine waits on (the future it yielded, or None for a bare
    yield) and waits on it as if the coroutine had just yielded it; later steps go straight
    to the coroutine."""

    __slots__ = ("_coro", "_waiting_on")

    def __init__(self, coro, waiting_on):
        self._coro = coro
        self._waiting_on = waiting_on

    def send(self, value):
        waiting_on = self._waiting_on
        if waiting_on is not _HANDED:
            self._waiting_on = _HANDED
            return waiting_on
        return self._coro.send(value)

    def throw(self, exc, value=None, traceback=None):
        waiting_on = self._waiting_on
        if waiting_on is not _HANDED:
            # Cancelled before the task's first step: the future the coroutine waits on is
            # cancelled as the task would have done, so whoever resolves it sees nobody
            # wants the result.
            self._waiting_on = _HANDED
            if isinstance(waiting_on, asyncio.Future):
                waiting_on.cancel()
        if value is None and traceback is None:
            return self._coro.throw(exc)
        return self._coro.throw(exc, value, traceback)

    def close(self):
        self._waiting_on = _HANDED
        return self._coro.close()

    def __await__(self):
        raise TypeError("a resumed coroutine runs in its own task")
