"""Busy-polling a worker's socket between batches, while the machine has a core to spare.

A worker that blocks in recv() after a batch is woken by the kernel when the next frame comes,
and on a VM a wake-up is costly (an idle virtual CPU must be woken): at low load most of a
small request's time in the worker is that wake-up. Polling the socket for a while instead
catches the next frame awake, but the polling core is lost to everyone else: on a busy 2-core
machine the front and the client need it (both measured: perf/findings/
2026-11-front-tuning.md).

So a worker polls only while the machine has at least MIN_IDLE_CORES idle, as /proc/stat
tells over intervals of CHECK_S. An interval in which the worker polled says nothing (others
slowed down by the polling look idle), so after SPIN_INTERVALS of polling the worker blocks
for one interval and measures again.
"""

import os
import time

DEFAULT_SPIN_US = 300
# A decoupled model's worker polls longer: a client reading a stream sends its next request
# once it has read the last response, milliseconds after the front saw the stream end, and a
# worker woken from a virtual CPU that slept that long reaches its first response slower. With
# the front polling through that gap too (dispatch/front_spin.py), polling that long here
# shortened the median time to first response at concurrency 1 to Triton's
# (perf/findings/2026-11-streaming.md).
STREAM_SPIN_US = 20_000
MIN_IDLE_CORES = 0.75
# For a client that waits on its stream alone: reading a stream's responses keeps it busy, and
# the idle cores measured in repeat's latency rounds (one such client, no polling) stayed under
# MIN_IDLE_CORES, so with it the front and the worker would hardly ever poll for it. Where many
# streams are open, MIN_IDLE_CORES stays: polling with this threshold then cost perf_analyzer's
# streaming at concurrency 8 and 32 part of its throughput (perf/findings/2026-11-streaming.md;
# dispatch/front_spin.py says where the front uses which).
STREAM_MIN_IDLE_CORES = 0.3
CHECK_S = 0.05
SPIN_INTERVALS = 7


def _cpu_jiffies(path: str) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, or None where there is no /proc/stat."""
    try:
        with open(path, "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user and nice
    return total - idle, total


class IdleSpin:
    """Decides, for one worker, whether to poll before blocking; `spin_s` is for how long."""

    def __init__(self, spin_us: int = DEFAULT_SPIN_US, stat_path: str = "/proc/stat",
                 clock=time.monotonic, cores: int | None = None,
                 min_idle_cores: float = MIN_IDLE_CORES):
        self.spin_s = spin_us / 1e6
        self.min_idle_cores = min_idle_cores
        self._stat_path = stat_path
        self._clock = clock
        self._cores = cores or os.cpu_count() or 1
        self._sample = _cpu_jiffies(stat_path) if spin_us > 0 else None
        self._checked = clock()
        self._polled_intervals = 0
        self.allowed = False

    def should_spin(self) -> bool:
        if self._sample is None:
            return False  # off, or no /proc/stat
        now = self._clock()
        if now - self._checked >= CHECK_S:
            self._update(now)
        return self.allowed

    def _update(self, now: float) -> None:
        sample = _cpu_jiffies(self._stat_path)
        if sample is None:
            self._sample, self.allowed = None, False
            return
        previous = self._sample
        assert previous is not None  # only should_spin calls it, past its check of _sample
        busy = sample[0] - previous[0]
        total = sample[1] - previous[1]
        self._sample, self._checked = sample, now
        if self.allowed:
            self._polled_intervals += 1
            self.allowed = self._polled_intervals < SPIN_INTERVALS
            return
        self._polled_intervals = 0
        self.allowed = total > 0 and (total - busy) / total * self._cores >= self.min_idle_cores
