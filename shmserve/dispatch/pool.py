"""The instances of one model version: which are idle, and getting one to run a batch."""

import asyncio
import collections
import logging

from shmserve.errors import Code, ServerError

log = logging.getLogger("shmserve.dispatch")


class InstancePool:
    """Hands out idle instances in FIFO order of the waiters.

    Works with anything that has `alive`, `execute(batch)` and `instance_name`, so the
    schedulers above can be tested with fake instances.
    """

    def __init__(self, instances: list):
        self.instances = list(instances)
        self._idle = collections.deque(self.instances)
        self._waiters: collections.deque = collections.deque()
        self._closed = False

    @property
    def ready(self) -> bool:
        return not self._closed and any(i.alive for i in self.instances)

    def idle_count(self) -> int:
        return len(self._idle)

    async def acquire(self):
        while True:
            while self._idle:
                inst = self._idle.popleft()
                if inst.alive:
                    return inst
            if self._closed or not any(i.alive for i in self.instances):
                raise ServerError(Code.UNAVAILABLE, "no model instance is available")
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_next()  # pass our wake-up on to the next waiter
                raise

    def release(self, inst) -> None:
        # A restarted instance comes back through here too, possibly while still queued.
        if inst not in self._idle:
            self._idle.append(inst)
        self._wake_next()

    def instance_lost(self, inst) -> None:
        """An instance died: waiters must re-check whether any instance is left."""
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)

    def _wake_next(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def close(self) -> None:
        self._closed = True
        self.instance_lost(None)
