"""Per-model-version counters behind the statistics extension and the Prometheus metrics.

Recording is a handful of integer additions on the event loop; the metrics endpoint reads
these at scrape time, so the hot path never touches prometheus_client.
"""

import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Optional

from shmserve.observability.summaries import LatencySummaries

# Triton's default nv_inference_first_response_histogram_ms buckets (ms); a config's
# model_metrics can set others.
FIRST_RESPONSE_BOUNDS_MS = (100, 500, 2000, 5000)
FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"

# Upper bounds (inclusive, as Prometheus' `le`) of the request-duration histogram's buckets, in
# ns so that recording compares integers: 100 us to 1 min, covering shared-memory requests of a
# few microseconds' overhead as well as slow generative models. The last bucket is +Inf.
REQUEST_DURATION_BOUNDS_NS = tuple(int(s * 1e9) for s in (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0))


def first_response_bounds_ms(config) -> tuple:
    """The first-response histogram's bucket bounds: the last ones a config's model_metrics
    sets for that family (as Triton applies them in order), else Triton's default."""
    bounds = FIRST_RESPONSE_BOUNDS_MS
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE_FAMILY:
            bounds = tuple(sorted(set(control.histogram_options.buckets)))
    return bounds


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class DeviceStats:
    """What a version's instances on one GPU did: in Triton, those instances report to a
    reporter of their own, whose series carry the GPU's `gpu_uuid`."""
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    failures: dict = field(default_factory=dict)  # by metric reason, as ModelStats'
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    summaries: Optional[LatencySummaries] = None


@dataclass
class ModelStats:
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    # Response cache (shmserve/extensions/response_cache.py): lookups that hit (their time), and
    # lookups that missed (the lookup and the later insertion).
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # Failures by Triton's metric reason: REJECTED, CANCELED, BACKEND, OTHER.
    failures: dict = field(default_factory=dict)
    batches: dict = field(default_factory=dict)  # batch size -> BatchStats
    pending: int = 0  # queued in the scheduler, not yet executing
    inflight: int = 0  # accepted and not yet answered
    # Requests, successful or failed, per request-duration bucket (not cumulative).
    request_buckets: list = field(
        default_factory=lambda: [0] * (len(REQUEST_DURATION_BOUNDS_NS) + 1))
    # Time to a decoupled request's first response, per bucket of first_response_bounds_ms
    # (not cumulative), and its sum; kept only with --metrics-config histogram_latencies=true.
    first_response_bounds_ms: tuple = FIRST_RESPONSE_BOUNDS_MS
    first_response_buckets: list = field(init=False)
    first_response_ns: int = 0
    # Quantiles of the last minute's durations, with --metrics-config summary_latencies=true.
    summaries: Optional[LatencySummaries] = None
    # Whether the metrics split what GPU instances do by GPU (Triton labels those series
    # with `gpu_uuid` when its GPU metrics are on): then `devices` maps a GPU's UUID to the
    # DeviceStats of the instances on it. Their requests and batches count in the fields
    # above too, for the statistics extension; the summaries are the exception: a request's
    # durations go to its device's alone.
    per_device: bool = False
    devices: dict = field(default_factory=dict)

    def __post_init__(self):
        self.first_response_buckets = [0] * (len(self.first_response_bounds_ms) + 1)
        # Compared in ns, as measured; a bound in ms need not be whole.
        self._first_response_bounds_ns = tuple(ms * 1e6 for ms in self.first_response_bounds_ms)

    def record_first_response(self, ns: int) -> None:
        self.first_response_buckets[bisect_left(self._first_response_bounds_ns, ns)] += 1
        self.first_response_ns += ns

    def device(self, uuid: str) -> DeviceStats:
        d = self.devices.get(uuid)
        if d is None:
            d = self.devices[uuid] = DeviceStats(
                summaries=None if self.summaries is None else self.summaries.sibling())
        return d

    def record_success(self, *, batch_size: int, request_ns: int, queue_ns: int,
                       compute_input_ns: int, compute_infer_ns: int,
                       compute_output_ns: int, device: str = "") -> None:
        """One request answered; its compute times are those of the batch it ran in, on an
        instance of GPU `device` (a UUID; empty for other instances)."""
        self.inference_count += batch_size
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.request_buckets[bisect_left(REQUEST_DURATION_BOUNDS_NS, request_ns)] += 1
        # Added here rather than by five calls of Duration.add: this runs for every request.
        success, queue = self.success, self.queue
        success.count += 1
        success.ns += request_ns
        queue.count += 1
        queue.ns += queue_ns
        compute_input, compute_infer = self.compute_input, self.compute_infer
        compute_input.count += 1
        compute_input.ns += compute_input_ns
        compute_infer.count += 1
        compute_infer.ns += compute_infer_ns
        self.compute_output.count += 1
        self.compute_output.ns += compute_output_ns
        summaries = self.summaries
        if device and self.per_device:
            d = self.device(device)
            d.inference_count += batch_size
            d.success.add(request_ns)
            d.queue.add(queue_ns)
            d.compute_input.add(compute_input_ns)
            d.compute_infer.add(compute_infer_ns)
            d.compute_output.add(compute_output_ns)
            summaries = d.summaries
        if summaries is not None:
            summaries.observe(request_ns, queue_ns, compute_input_ns, compute_infer_ns,
                              compute_output_ns)

    def record_cache_hit(self, request_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache: a success, but no inference."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.success.add(request_ns)
        self.request_buckets[bisect_left(REQUEST_DURATION_BOUNDS_NS, request_ns)] += 1
        self.cache_hit.add(lookup_ns)
        if self.summaries is not None:
            self.summaries.observe_cached(request_ns)

    def record_execution(self, batch_size: int, timings) -> None:
        """One batch executed (batch_size: the sum of its requests' batch sizes)."""
        self.execution_count += 1
        if timings.gpu_uuid and self.per_device:
            self.device(timings.gpu_uuid).execution_count += 1
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStats()
        b.compute_input.add(timings.compute_input_ns)
        b.compute_infer.add(timings.compute_infer_ns)
        b.compute_output.add(timings.compute_output_ns)

    def record_failure(self, request_ns: int, reason: str, device: str = "") -> None:
        """`device`: the UUID of the GPU whose instance failed the request, if one did."""
        self.fail.add(request_ns)
        self.request_buckets[bisect_left(REQUEST_DURATION_BOUNDS_NS, request_ns)] += 1
        self.failures[reason] = self.failures.get(reason, 0) + 1
        if device and self.per_device:
            d = self.device(device)
            d.fail.add(request_ns)
            d.failures[reason] = d.failures.get(reason, 0) + 1


def stats_json(mv, s: ModelStats) -> dict:
    """The statistics extension's JSON for one model version (numbers as JSON numbers)."""
    def d(x):
        return {"count": x.count, "ns": x.ns}

    return {
        "name": mv.name,
        "version": str(mv.version),
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": d(s.success), "fail": d(s.fail), "queue": d(s.queue),
            "compute_input": d(s.compute_input), "compute_infer": d(s.compute_infer),
            "compute_output": d(s.compute_output), "cache_hit": d(s.cache_hit), "cache_miss": d(s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [
            {"batch_size": size, "compute_input": d(b.compute_input),
             "compute_infer": d(b.compute_infer), "compute_output": d(b.compute_output)}
            for size, b in sorted(s.batches.items())
        ],
        "memory_usage": [],
    }
