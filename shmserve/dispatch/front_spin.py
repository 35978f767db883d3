"""Keeping the front's event loop awake around the batches it sends, while the machine has a
core to spare.

The front waits for a worker's result, and for a client's next request, in epoll like for
anything else, and on a VM being woken from an idle virtual CPU costs 20-40 microseconds: at
low load, a large part of a small request (the worker's side of the same problem is
ipc/idle_spin.py). So for `spin_us` after a batch was sent and after one ended, a callback
that queues itself again keeps the loop polling (an event loop with a ready callback polls
without blocking): the result is read the moment it arrives, and so is the request that a
client sends once it has its answer. It yields the CPU on every turn, so that a process with
work on the same core (the worker, the client) goes first, and it polls only while
IdleSpin's gate sees a core to spare.
"""

import asyncio
import os
import time

from shmserve.ipc.idle_spin import DEFAULT_SPIN_US, IdleSpin


class FrontSpin:
    def __init__(self, spin_us: int = DEFAULT_SPIN_US, gate=None, clock=time.perf_counter):
        """`gate`: what says whether the machine has a core to spare (an IdleSpin unless
        given)."""
        self._spin_s = spin_us / 1e6
        self._gate = gate if gate is not None else IdleSpin(spin_us)
        self._clock = clock
        self._until = 0.0
        self.spinning = False
        self._loop = None

    def watch(self, batch: asyncio.Future) -> None:
        """`batch` was just sent to a worker: poll for `spin_us`, and again for `spin_us`
        once it has ended."""
        if self._spin_s <= 0:
            return
        batch.add_done_callback(self._ended)
        self._ended(batch)

    def _ended(self, batch) -> None:
        self._until = self._clock() + self._spin_s
        if not self.spinning and self._gate.should_spin():
            self.spinning = True
            # The batch's loop, not get_running_loop(): on Python 3.11 that is a getpid()
            # system call, and a turn of the spin should cost as little as it can.
            self._loop = batch.get_loop()
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self._clock() < self._until and self._gate.should_spin():
            os.sched_yield()
            self._loop.call_soon(self._turn)
        else:
            self.spinning = False
