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

Streams are held differently (`hold`): the loop polls for as long as any stream is open and
for STREAM_LINGER_S after the last one closed. A client reading a stream sends its next request
only once it has read the last response, a few milliseconds after the front sent it; a
virtual CPU that sleeps that long comes back with cold caches, and every stage of the next
request runs several times slower. In that gap the client is still busy reading, so the linger
asks a gate of its own, with a lower threshold (STREAM_MIN_IDLE_CORES). So do open streams
whose requests each came when nothing else was in flight (`lone`): one client waiting on its
stream. Where more are open, their clients and the front share the cores, and the usual gate
decides.
"""

import asyncio
import functools
import os
import time

from shmserve.ipc.idle_spin import DEFAULT_SPIN_US, STREAM_MIN_IDLE_CORES, IdleSpin

# How long the front keeps polling after a stream ends: a client's next request comes a few
# milliseconds later, and lingering past that gap gave faster first responses than shorter
# lingers in the runs that compared them; the gate closes it sooner whenever the machine gets
# busy. Measured in perf/bench_streaming.py (perf/findings/2026-11-streaming.md).
STREAM_LINGER_S = 0.2
# The linger applies under STREAM_MIN_IDLE_CORES, and lone streams are polled under it too,
# here and in their worker: both shortened the time to first response at concurrency 1, while
# perf_analyzer streaming at concurrency 8 and 32 kept its throughput and CPU time, its
# streams not being lone (same findings).


class FrontSpin:
    def __init__(self, spin_us: int = DEFAULT_SPIN_US, gate=None, stream_gate=None,
                 clock=time.perf_counter):
        """`gate`, `stream_gate`: what says whether the machine has a core to spare, for
        batches and for streams (IdleSpins unless given)."""
        self._spin_s = spin_us / 1e6
        self._gate = gate if gate is not None else IdleSpin(spin_us)
        self._stream_gate = stream_gate if stream_gate is not None else IdleSpin(
            spin_us, min_idle_cores=STREAM_MIN_IDLE_CORES)
        self._clock = clock
        self._until = 0.0  # batches poll until then
        self._open_streams = 0  # held batches not yet ended
        self._crowded_streams = 0  # of those, the ones not lone
        self._stream_until = 0.0  # and the last one's linger
        self.spinning = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, batch: asyncio.Future) -> None:
        """`batch` was just sent to a worker: poll for `spin_us`, and again for `spin_us`
        once it has ended."""
        if self._spin_s <= 0:
            return
        batch.add_done_callback(self._ended)
        self._ended(batch)

    def hold(self, batch: asyncio.Future, lone: bool = False) -> None:
        """`batch`, with streams, was just sent to a worker: poll until it has ended and for
        STREAM_LINGER_S more. `lone`: its request came while no other was in flight."""
        if self._spin_s <= 0:
            return
        self._open_streams += 1
        if not lone:
            self._crowded_streams += 1
        batch.add_done_callback(functools.partial(self._released, lone))
        self._start(batch)

    def _released(self, lone: bool, batch) -> None:
        self._open_streams -= 1
        if not lone:
            self._crowded_streams -= 1
        self._stream_until = self._clock() + STREAM_LINGER_S
        self._start(batch)

    def _ended(self, batch) -> None:
        self._until = self._clock() + self._spin_s
        self._start(batch)

    def _start(self, batch) -> None:
        if not self.spinning and self._wanted():
            self.spinning = True
            # The batch's loop, not get_running_loop(): on Python 3.11 that is a getpid()
            # system call, and a turn of the spin should cost as little as it can.
            loop = self._loop = batch.get_loop()
            loop.call_soon(self._turn)

    def _wanted(self) -> bool:
        now = self._clock()
        if (self._open_streams or now < self._until) and self._gate.should_spin():
            return True
        if self._open_streams:
            return not self._crowded_streams and self._stream_gate.should_spin()
        return now < self._stream_until and self._stream_gate.should_spin()

    def _turn(self) -> None:
        if self._wanted():
            os.sched_yield()
            assert self._loop is not None  # _start set it before the first turn
            self._loop.call_soon(self._turn)
        else:
            self.spinning = False
