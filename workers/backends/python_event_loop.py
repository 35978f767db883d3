"""The event loop a Python model's coroutines run on (an async execute, initialize, is_ready
or finalize, and the tasks they start), as Triton's stub runs them: one loop per instance, in
a thread of its own from the first coroutine on, running between calls too, and the worker's
current event loop. A model that never returns a coroutine never starts it.
"""

import asyncio
import inspect
import threading


class ModelEventLoop:
    """One instance's event loop, started by the first coroutine it is given."""

    def __init__(self):
        self._loop = None
        self._thread = None

    def complete(self, result):
        """The value of `result`: a coroutine runs to completion on the loop, waited for
        here."""
        if not inspect.iscoroutine(result):
            return result
        return asyncio.run_coroutine_threadsafe(result, self._running()).result()

    def start(self, coroutine):
        """Runs `coroutine` on the loop without waiting for it: its concurrent Future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running())

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._loop.is_running():
                self._loop.close()
            self._loop = None

    def _running(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._thread = threading.Thread(target=loop.run_forever, daemon=True,
                                            name="model-event-loop")
            self._thread.start()
            self._loop = loop
        return self._loop
