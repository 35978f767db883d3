"""Latency summaries (`--metrics-config summary_latencies=true`): quantiles of the request,
queue and compute durations of the last minute, per model version, for Triton's
`nv_inference_*_summary_us` metrics.

Triton's summaries (prometheus-cpp) cover a sliding minute in five age buckets. Here each age
bucket keeps a uniform sample (reservoir) of at most SAMPLES_PER_BUCKET of its observations, so
that memory and scrape time stay bounded under any load; a quantile is read from the union of
the buckets, each sample weighted by how many observations it stands for. A quantile's rank
error is then about sqrt(q (1 - q) / samples): 0.001 at 0.99 once the window holds five full
buckets (10,240 samples), Triton's default target there. Counts and sums are of every
observation since the start.
"""

import math
import random
import time
from array import array

# Triton's default summary_quantiles: quantile -> allowed error.
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
MAX_AGE_S = 60.0
AGE_BUCKETS = 5
SAMPLES_PER_BUCKET = 2048
# The durations a success adds to, in the order `observe` takes them.
KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")


def parse_quantiles(text: str) -> tuple:
    """"0.5:0.05,0.9:0.01" -> ((0.5, 0.05), (0.9, 0.01)); ValueError when malformed."""
    pairs = []
    for item in text.split(","):
        quantile, sep, error = item.partition(":")
        try:
            pair = (float(quantile), float(error))
        except ValueError:
            pair = None
        if not sep or pair is None or not (0 <= pair[0] <= 1 and 0 <= pair[1] <= 1):
            raise ValueError(f"expected <quantile>:<error> pairs of numbers in [0, 1], "
                             f"got '{item}'")
        pairs.append(pair)
    return tuple(pairs)


class _Bucket:
    __slots__ = ("seen", "samples")

    def __init__(self):
        self.seen = 0
        self.samples = array("d")

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.samples) < SAMPLES_PER_BUCKET:
            self.samples.append(value)
        else:
            slot = random.randrange(self.seen)
            if slot < SAMPLES_PER_BUCKET:
                self.samples[slot] = value


class WindowQuantiles:
    """Quantiles of one duration's observations of the last MAX_AGE_S seconds."""

    __slots__ = ("_buckets", "count", "sum")

    def __init__(self):
        self._buckets = [_Bucket() for _ in range(AGE_BUCKETS)]
        self.count = 0
        self.sum = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self._buckets[-1].add(value)

    def rotate(self) -> None:
        """The oldest age bucket leaves the window; a new one starts."""
        self._buckets.pop(0)
        self._buckets.append(_Bucket())

    def quantiles(self, qs) -> list:
        """The value at each quantile of `qs`; NaN for each when the window is empty."""
        weighted = sorted((value, b.seen / len(b.samples))
                          for b in self._buckets if b.samples for value in b.samples)
        total = sum(w for _, w in weighted)
        if not weighted:
            return [math.nan for _ in qs]
        out = []
        for q in qs:
            target, seen = q * total, 0.0
            for value, weight in weighted:  # noqa: B007 (the value it stops at is kept below)
                seen += weight
                if seen >= target:
                    break
            out.append(value)
        return out


class LatencySummaries:
    """A model version's five duration summaries, in microseconds."""

    __slots__ = ("quantiles", "windows", "_rotate_at", "_clock")

    def __init__(self, quantiles=DEFAULT_QUANTILES, clock=time.monotonic):
        self.quantiles = tuple(q for q, _ in quantiles)
        self.windows = {kind: WindowQuantiles() for kind in KINDS}
        self._clock = clock
        self._rotate_at = clock() + MAX_AGE_S / AGE_BUCKETS

    def sibling(self) -> "LatencySummaries":
        """Empty summaries with the same quantiles and clock."""
        return LatencySummaries(tuple((q, 0.0) for q in self.quantiles), self._clock)

    def observe(self, request_ns: int, queue_ns: int, compute_input_ns: int,
                compute_infer_ns: int, compute_output_ns: int) -> None:
        self._age()
        w = self.windows
        w["request"].add(request_ns / 1000)
        w["queue"].add(queue_ns / 1000)
        w["compute_input"].add(compute_input_ns / 1000)
        w["compute_infer"].add(compute_infer_ns / 1000)
        w["compute_output"].add(compute_output_ns / 1000)

    def observe_cached(self, request_ns: int) -> None:
        """A request answered from the response cache: a request duration, nothing else."""
        self._age()
        self.windows["request"].add(request_ns / 1000)

    def read(self, kind: str) -> tuple:
        """(count, sum, [(quantile, value)]) of one kind, for a scrape."""
        self._age()
        window = self.windows[kind]
        return window.count, window.sum, list(zip(self.quantiles,
                                                  window.quantiles(self.quantiles)))

    def _age(self) -> None:
        now = self._clock()
        if now < self._rotate_at:
            return
        step = MAX_AGE_S / AGE_BUCKETS
        # A long quiet spell ages out every bucket, not one.
        for _ in range(min(AGE_BUCKETS, int((now - self._rotate_at) // step) + 1)):
            for window in self.windows.values():
                window.rotate()
        self._rotate_at = now + step
