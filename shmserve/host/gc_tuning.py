"""The cyclic garbage collector of the front process, set for serving.

Python collects its youngest generation whenever container objects allocated and still alive
outnumber those freed by 700. A busy front has a few thousand such objects in flight
(futures, coroutines, frames, the lists of a batch), so under load it ran a young collection
every few dozen requests, on the one thread all requests pass through. With the threshold at
YOUNG_THRESHOLD requests trigger no collection there (what they allocate, they free; cycles
are rare), and the server serves more (perf/findings/2026-11-front-tuning.md).

A count of objects says nothing of their size, though: a cycle that holds a request's tensors
(an exception kept with its traceback, say) would wait for 10,000 more objects, however long
that takes. So a timer collects the young generations every SWEEP_S, and everything every
FULL_EVERY sweeps: garbage lives about a second at most, for a collection that costs well
under a millisecond a second.
"""

import asyncio
import gc

YOUNG_THRESHOLD = 10_000
SWEEP_S = 1.0
FULL_EVERY = 10


class GcTuner:
    def __init__(self, young_threshold: int = YOUNG_THRESHOLD, sweep_s: float = SWEEP_S,
                 full_every: int = FULL_EVERY):
        self._young_threshold = young_threshold
        self._sweep_s = sweep_s
        self._full_every = full_every
        # the process's own thresholds, while started
        self._saved: tuple[int, int, int] | None = None
        self._sweeps = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called once startup has built what lives as long as the server."""
        # Out of the collector's sight, a full collection scans only what requests leave
        # behind: full collections of the whole heap, several a second under load, set the
        # p99 latency on the 2-core reference machine.
        gc.freeze()
        if self._saved is not None:
            return
        self._saved = gc.get_threshold()
        gc.set_threshold(self._young_threshold, *self._saved[1:])
        self._loop = loop
        self._schedule()

    def stop(self) -> None:
        """The process's own settings again (an application embedding the server keeps
        running)."""
        if self._saved is None:
            return
        assert self._timer is not None  # started: the first sweep is scheduled
        self._timer.cancel()
        gc.set_threshold(*self._saved)
        self._saved = self._timer = None

    def _schedule(self) -> None:
        assert self._loop is not None  # set by start
        self._timer = self._loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        self._sweeps += 1
        gc.collect(2 if self._sweeps % self._full_every == 0 else 1)
        self._schedule()
