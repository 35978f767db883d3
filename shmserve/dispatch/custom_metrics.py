"""A model instance's custom metrics (pb_utils.MetricFamily), as its worker last reported
them, and the front's asks for fresh ones.

At each scrape the front writes the worker's metrics eventfd (`fd`, handed to each process at
its start), and a thread of the worker answers with a MetricsReport of the values as they are
then, numbering the asks it answers (see workers/metrics_report.py). A scrape waits for the
answer to its own ask, for a while at most.
"""

import asyncio
import os
from typing import Optional

from shmserve.ipc import messages


class CustomMetrics:
    def __init__(self):
        self.families: list = []  # as the current process last reported them
        self.fd = -1  # the eventfd the worker's metrics thread reads; -1 while none runs
        self._asked = 0  # asks written to it
        self.waiters: list = []  # (ask number, future) of the scrapes waiting for answers

    def open(self) -> None:
        # Blocking, for the worker's metrics thread, which sleeps on it; the front's writes
        # never block (the count stays far below the eventfd's limit).
        self.fd = os.eventfd(0, os.EFD_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def restart(self) -> None:
        """A new process starts its metrics anew."""
        self.families = []
        self._asked = 0
        self.wake()

    async def fresh(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """Ask the worker for its custom metrics, and wait until it has answered, `timeout`
        seconds at most."""
        if self.fd < 0:
            return
        self._asked += 1
        future = loop.create_future()
        waiter = (self._asked, future)
        self.waiters.append(waiter)
        os.eventfd_write(self.fd, 1)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    def report(self, msg: messages.MetricsReport) -> None:
        if msg.families is not None:  # else unchanged since its last report
            self.families = msg.families
        self.wake(msg.answered)

    def wake(self, answered: Optional[int] = None) -> None:
        """Wake the scrapes whose asks the worker has answered; all of them when `answered`
        is None (the process is gone: its last values are all there is)."""
        waiting = []
        for waiter in self.waiters:
            asked, future = waiter
            if answered is not None and asked > answered:
                waiting.append(waiter)
            elif not future.done():
                future.set_result(None)
        self.waiters = waiting
