"""Prometheus metrics with Triton's names, collected from the per-model statistics at
scrape time (the request path only bumps integers in `stats.ModelStats`), plus two histograms
Triton lacks, under the `shmserve_` prefix so that nobody mistakes them for Triton's."""

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from shmserve.observability.stats import REQUEST_DURATION_BOUNDS_NS
from shmserve.observability.summaries import LatencySummaries
from shmserve.registry import Registry

log = logging.getLogger("shmserve")

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# How long a scrape waits for an instance's custom metrics (see refresh_custom_metrics): one
# that has not answered by then (a model holding the GIL in native code) shows its last values.
CUSTOM_METRICS_WAIT_S = 1.0
# Upper bounds of the batch-size histogram's buckets (the last bucket is +Inf).
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_REQUEST_DURATION_LE = (*(repr(ns / 1e9) for ns in REQUEST_DURATION_BOUNDS_NS), "+Inf")


class CounterMetricFamily(Metric):
    """A counter exposed under exactly its name: Triton's counters carry no `_total`
    suffix, which prometheus_client's own CounterMetricFamily would add."""

    def __init__(self, name: str, documentation: str, labels: list):
        super().__init__(name, documentation, "counter")
        self._labels = labels

    def add_metric(self, values: list, value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labels, values)), value)


class ModelMetricsCollector:
    def __init__(self, registry: Registry, *, counter_latencies: bool = True,
                 histogram_latencies: bool = False):
        """The --metrics-config switches: the cumulative duration counters (on by default)
        and the first-response histogram (off by default), as in Triton."""
        self._registry = registry
        self._counter_latencies = counter_latencies
        self._histogram_latencies = histogram_latencies

    def collect(self):
        success = _family("nv_inference_request_success", "counter",
                          "Number of successful inference requests, all batch sizes")
        failure = _family("nv_inference_request_failure", "counter",
                          "Number of failed inference requests, all batch sizes")
        count = _family("nv_inference_count", "counter",
                        "Number of inferences performed (does not include cached requests)")
        exec_count = _family("nv_inference_exec_count", "counter",
                             "Number of model executions performed (does not include cached "
                             "requests)")
        pending = _family("nv_inference_pending_request_count", "gauge",
                          "Instantaneous number of pending requests awaiting execution "
                          "per-model.")
        durations = {
            "request": _family("nv_inference_request_duration_us", "counter",
                               "Cumulative inference request duration in microseconds "
                               "(includes cached requests)"),
            "queue": _family("nv_inference_queue_duration_us", "counter",
                             "Cumulative inference queuing duration in microseconds (includes "
                             "cached requests)"),
            "compute_input": _family("nv_inference_compute_input_duration_us", "counter",
                                     "Cumulative compute input duration in microseconds (does "
                                     "not include cached requests)"),
            "compute_infer": _family("nv_inference_compute_infer_duration_us", "counter",
                                     "Cumulative compute inference duration in microseconds "
                                     "(does not include cached requests)"),
            "compute_output": _family("nv_inference_compute_output_duration_us", "counter",
                                      "Cumulative inference compute output duration in "
                                      "microseconds (does not include cached requests)"),
        }
        load = _family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
        request_hist = _family("shmserve_inference_request_duration_seconds", "histogram",
                               "End-to-end duration of inference requests, successful and "
                               "failed, in seconds")
        batch_hist = _family("shmserve_inference_batch_size", "histogram",
                             "Batch size of each model execution (the sum of its requests' "
                             "batch sizes)")
        # Only for models whose config enables the response cache.
        cache = {
            "hits": _family("nv_cache_num_hits_per_model", "counter",
                            "Number of cache hits per model"),
            "misses": _family("nv_cache_num_misses_per_model", "counter",
                              "Number of cache misses per model"),
            "hit_us": _family("nv_cache_hit_duration_per_model", "counter",
                              "Total cache hit duration per model, in microseconds"),
            "miss_us": _family("nv_cache_miss_duration_per_model", "counter",
                               "Total cache miss (insert+lookup) duration per model, "
                               "in microseconds"),
        }
        first_response = _family("nv_inference_first_response_histogram_ms", "histogram",
                                 "Duration from request to first response in milliseconds")
        cached_models = 0
        for mv in self._registry.all_versions():
            labels = model_labels(mv)
            s = mv.stats
            cached = mv.config.response_cache.enable
            for r in _reporters(mv, labels):
                _add(load, r.labels, r.load_seconds)
                _add(success, r.labels, r.success)
                for reason in FAILURE_REASONS:
                    _add(failure, {**r.labels, "reason": reason}, r.failures.get(reason, 0))
                _add(count, r.labels, r.inference_count)
                _add(exec_count, r.labels, r.execution_count)
                _add(pending, r.labels, r.pending)
                for kind, ns in r.durations_ns.items():
                    _add(durations[kind], r.labels, ns // 1000)
                if cached and "gpu_uuid" in r.labels:
                    for family in cache.values():  # a GPU's reporter counts no cache use
                        _add(family, r.labels, 0)
            _add_histogram(request_hist, labels, _request_buckets(s.request_buckets),
                           (s.success.ns + s.fail.ns) / 1e9)
            _add_histogram(batch_hist, labels, *_batch_buckets(s.batches))
            _add_histogram(first_response, labels, _first_response_buckets(s),
                           s.first_response_ns / 1e6)
            if cached:
                cached_models += 1
                _add(cache["hits"], labels, s.cache_hit.count)
                _add(cache["misses"], labels, s.cache_miss.count)
                _add(cache["hit_us"], labels, s.cache_hit.ns // 1000)
                _add(cache["miss_us"], labels, s.cache_miss.ns // 1000)
        yield from (success, failure, count, exec_count, pending)
        if self._counter_latencies:
            yield from durations.values()
        yield from (load, request_hist, batch_hist)
        if self._histogram_latencies:
            yield first_response
        if cached_models:
            yield from cache.values()
        yield from _summaries(self._registry)


@dataclass(slots=True)
class _Reporter:
    """The series that one of Triton's metric reporters of a version shows: the version's own
    (requests that no GPU instance ran, the queue, the load time), or that of its instances on
    one GPU, labelled with the GPU's `gpu_uuid`."""
    labels: dict
    success: int
    failures: dict
    inference_count: int
    execution_count: int
    pending: int
    load_seconds: float
    durations_ns: dict  # "request", "queue", "compute_*" -> cumulative ns
    summaries: Optional[LatencySummaries]


def _reporters(mv, labels: dict) -> list:
    s = mv.stats
    own = _Reporter(labels, s.success.count, dict(s.failures), s.inference_count,
                    s.execution_count, s.pending, mv.load_seconds,
                    {"request": s.success.ns + s.fail.ns, "queue": s.queue.ns,
                     "compute_input": s.compute_input.ns, "compute_infer": s.compute_infer.ns,
                     "compute_output": s.compute_output.ns},
                    s.summaries)
    reporters = [own]
    for uuid, d in sorted(_devices(mv).items()):
        gpu = _Reporter({**labels, "gpu_uuid": uuid}, d.success.count, dict(d.failures),
                        d.inference_count, d.execution_count, 0, 0.0,
                        {"request": d.success.ns + d.fail.ns, "queue": d.queue.ns,
                         "compute_input": d.compute_input.ns,
                         "compute_infer": d.compute_infer.ns,
                         "compute_output": d.compute_output.ns},
                        d.summaries)
        # The version's own counts hold every request (the statistics extension shows them
        # all); its reporter shows only those that no GPU's did.
        own.success -= gpu.success
        for reason, n in gpu.failures.items():
            own.failures[reason] -= n
        own.inference_count -= gpu.inference_count
        own.execution_count -= gpu.execution_count
        for kind, ns in gpu.durations_ns.items():
            own.durations_ns[kind] -= ns
        reporters.append(gpu)
    return reporters


def _devices(mv) -> dict:
    """GPU UUID -> DeviceStats of the version's GPUs: those that ran its work, and those its
    instances are on (whose series, as Triton's, exist before their first request)."""
    s = mv.stats
    if not s.per_device:
        return {}
    if mv.pool is not None:
        for instance in mv.pool.instances:
            if instance.gpu_uuid:
                s.device(instance.gpu_uuid)
    return s.devices


def model_labels(mv) -> dict:
    """The labels of a model version's series: `model`, `version`, and `_<key>` for each
    entry of the config's `metric_tags`, as Triton adds them."""
    labels = {"model": mv.name, "version": str(mv.version)}
    for key, value in sorted(mv.config.metric_tags.items()):
        labels["_" + key] = value
    return labels


def _family(name: str, kind: str, documentation: str) -> Metric:
    # Samples carry their labels whole: a model's metric_tags give it labels others lack.
    return Metric(name, documentation, kind)


def _add(family: Metric, labels: dict, value) -> None:
    family.add_sample(family.name, labels, value)


def _add_histogram(family: Metric, labels: dict, buckets: list, total) -> None:
    """`buckets`: (le, cumulative count) pairs, the last one +Inf."""
    for le, cumulative in buckets:
        family.add_sample(family.name + "_bucket", {**labels, "le": le}, cumulative)
    family.add_sample(family.name + "_count", labels, buckets[-1][1])
    family.add_sample(family.name + "_sum", labels, total)


_SUMMARY_HELP = {
    "request": "Summary of inference request duration in microseconds (includes cached "
               "requests)",
    "queue": "Summary of inference queuing duration in microseconds (includes cached requests)",
    "compute_input": "Summary of compute input duration in microseconds (does not include "
                     "cached requests)",
    "compute_infer": "Summary of compute inference duration in microseconds (does not include "
                     "cached requests)",
    "compute_output": "Summary of inference compute output duration in microseconds (does not "
                      "include cached requests)",
}


def _summaries(registry: Registry):
    """nv_inference_*_summary_us of the versions that keep summaries (summary_latencies)."""
    reporters = [r for mv in registry.all_versions() if mv.stats.summaries is not None
                 for r in _reporters(mv, model_labels(mv))]
    if not reporters:
        return
    for kind, help_text in _SUMMARY_HELP.items():
        name = f"nv_inference_{kind}_summary_us"
        family = Metric(name, help_text, "summary")
        for r in reporters:
            count, total, quantiles = r.summaries.read(kind)
            for q, value in quantiles:
                family.add_sample(name, {**r.labels, "quantile": repr(q)}, value)
            family.add_sample(name + "_count", r.labels, count)
            family.add_sample(name + "_sum", r.labels, total)
        yield family


def _first_response_buckets(s) -> list:
    # `le` as Triton's Prometheus library prints a double: 100 is "100", 0.5 is "0.5".
    bounds = [f"{ms:.16g}" for ms in s.first_response_bounds_ms] + ["+Inf"]
    return list(zip(bounds, itertools.accumulate(s.first_response_buckets)))


def _request_buckets(counts: list) -> list:
    """(le, cumulative count) pairs from the per-bucket counts of `ModelStats`."""
    return list(zip(_REQUEST_DURATION_LE, itertools.accumulate(counts)))


def _batch_buckets(batches: dict) -> tuple:
    """(buckets, sum) of the batch sizes executed, from the executions counted per size."""
    per_size = {size: b.compute_infer.count for size, b in batches.items()}
    buckets = [(str(bound), sum(n for size, n in per_size.items() if size <= bound))
               for bound in BATCH_SIZE_BOUNDS]
    buckets.append(("+Inf", sum(per_size.values())))
    return buckets, sum(size * n for size, n in per_size.items())


class Throttled:
    """Wraps a collector whose readings cost system calls: it is read at most once per
    --metrics-interval-ms, and scrapes in between get its last reading."""

    def __init__(self, collector, interval_s: float):
        self._collector = collector
        self._interval_s = interval_s
        self._read_at: float | None = None
        self._families: list[Metric] = []

    def collect(self):
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self._interval_s:
            self._families = list(self._collector.collect())
            self._read_at = now
        return iter(self._families)


class CpuMetricsCollector:
    """nv_cpu_* gauges read from /proc, as Triton reports them; utilization is that of the
    time since the previous reading."""

    def __init__(self):
        self._last = _cpu_times()

    def collect(self):
        now = _cpu_times()
        busy = now[0] - self._last[0]
        total = now[1] - self._last[1]
        self._last = now
        util = GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
        util.add_metric([], busy / total if total > 0 else 0.0)
        mem_total, mem_used = _memory()
        t = GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes")
        t.add_metric([], mem_total)
        u = GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes")
        u.add_metric([], mem_used)
        yield from (util, t, u)


def _cpu_times() -> tuple:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return (0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return (total - idle, total)


def _memory() -> tuple:
    info = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
    except OSError:
        return (0, 0)
    total = info.get("MemTotal", 0)
    return total, total - info.get("MemAvailable", 0)


class GpuMetricsCollector:
    """Triton's nv_gpu_* gauges and nv_energy_consumption counter, one series per GPU labelled
    with its UUID, read through NVML (the nvidia-ml-py package, module `pynvml`). A reading that
    NVML refuses (a device gone, a field the GPU lacks) is left out; the scrape still answers."""

    def __init__(self, nvml):
        self._nvml = nvml
        self._gpus = []  # (uuid, handle, energy in mJ when the server started or None)
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            if isinstance(uuid, bytes):  # older nvidia-ml-py releases return bytes
                uuid = uuid.decode()
            self._gpus.append((uuid, handle, self._read(nvml.nvmlDeviceGetTotalEnergyConsumption,
                                                          handle)))

    @classmethod
    def open(cls):
        """The collector, or None where nvidia-ml-py is missing or NVML finds no GPU."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.info("no GPU metrics: NVML did not start (%s)", exc)
            return None
        try:
            collector = cls(pynvml)
        except pynvml.NVMLError as exc:
            log.info("no GPU metrics: NVML could not list the GPUs (%s)", exc)
            pynvml.nvmlShutdown()
            return None
        if not collector._gpus:
            pynvml.nvmlShutdown()
            return None
        return collector

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def _read(self, fn, handle):
        try:
            return fn(handle)
        except self._nvml.NVMLError:
            return None

    def collect(self):
        nvml = self._nvml
        label = ["gpu_uuid"]
        util = GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=label)
        mem_total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=label)
        mem_used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=label)
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=label)
        limit = GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=label)
        energy = CounterMetricFamily("nv_energy_consumption",
                                     "GPU energy consumption in joules since the Triton Server started",
                                     labels=label)
        for uuid, handle, energy_at_start in self._gpus:
            lv = [uuid]
            rates = self._read(nvml.nvmlDeviceGetUtilizationRates, handle)
            if rates is not None:
                util.add_metric(lv, rates.gpu / 100.0)
            memory = self._read(nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                mem_total.add_metric(lv, memory.total)
                mem_used.add_metric(lv, memory.used)
            # NVML reports milliwatts and millijoules; Triton reports watts and joules.
            milliwatts = self._read(nvml.nvmlDeviceGetPowerUsage, handle)
            if milliwatts is not None:
                power.add_metric(lv, milliwatts / 1000.0)
            milliwatts = self._read(nvml.nvmlDeviceGetPowerManagementLimit, handle)
            if milliwatts is not None:
                limit.add_metric(lv, milliwatts / 1000.0)
            if energy_at_start is not None:
                millijoules = self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
                if millijoules is not None:
                    energy.add_metric(lv, (millijoules - energy_at_start) / 1000.0)
        yield from (util, mem_total, mem_used, power, limit, energy)


class CustomMetricsCollector:
    """The models' own metrics (pb_utils.MetricFamily), from each instance's latest report
    (refresh_custom_metrics asks for fresh ones first). A family and labels name one series
    for the whole server: counters and histograms add up across instances, a gauge shows the
    value set last. A family shows with the kind and description first declared (see
    Registry.metric_families), and only while it has series, as in Triton."""

    def __init__(self, registry: Registry):
        self._registry = registry

    def collect(self):
        declared = self._registry.metric_families
        families: dict = {}  # name -> (description, kind, {labels: [value, updated]})
        for mv in self._registry.all_versions():
            if mv.pool is None:
                continue
            for instance in mv.pool.instances:
                for name, description, kind, series in instance.custom_metrics:
                    family = families.get(name)
                    if family is None:
                        first = declared.get(name, (kind, description))
                        family = families[name] = (first[1], first[0], {})
                    if family[1] != kind:
                        continue
                    for labels, value, updated in series:
                        _merge(family[2], tuple(sorted(labels.items())), kind, value, updated)
        for name, (description, kind, series) in sorted(families.items()):
            if series:
                yield _custom_family(name, description, kind, series)


async def refresh_custom_metrics(registry: Registry, timeout: float) -> None:
    """Have every live instance send its custom metrics as they are now, so that a scrape
    shows what a model set just before it; `timeout` bounds the wait for any instance."""
    asks = [instance.fresh_custom_metrics(timeout)
            for mv in registry.all_versions() if mv.pool is not None
            for instance in mv.pool.instances if hasattr(instance, "fresh_custom_metrics")]
    if asks:
        await asyncio.gather(*asks)


_COUNTER, _GAUGE, _HISTOGRAM = 0, 1, 2


def _merge(series: dict, key: tuple, kind: int, value, updated: float) -> None:
    known = series.get(key)
    if known is None:
        series[key] = [_copy_value(value), updated]
    elif kind == _GAUGE:
        if updated > known[1]:
            series[key] = [value, updated]
    elif kind == _COUNTER:
        known[0] += value
    elif known[0][0] == value[0]:  # histograms with the same buckets
        bounds, counts, total, count = known[0]
        known[0] = [bounds, [a + b for a, b in zip(counts, value[1])], total + value[2],
                    count + value[3]]


def _copy_value(value):
    """A histogram's value is added to later: the report's own lists stay as they were."""
    return [value[0], list(value[1]), value[2], value[3]] if isinstance(value, list) else value


def _custom_family(name: str, description: str, kind: int, series: dict) -> Metric:
    family = Metric(name, description, ("counter", "gauge", "histogram")[kind])
    for key, (value, _) in sorted(series.items()):
        labels = dict(key)
        if kind != _HISTOGRAM:
            family.add_sample(name, labels, value)
            continue
        bounds, counts, total, count = value
        cumulative = 0
        for bound, n in zip([*map(_bound_text, bounds), "+Inf"], counts):
            cumulative += n
            family.add_sample(name + "_bucket", {**labels, "le": bound}, cumulative)
        family.add_sample(name + "_count", labels, count)
        family.add_sample(name + "_sum", labels, total)
    return family


def _bound_text(bound: float) -> str:
    """A bucket bound as Triton writes its `le`: "1", "2.5", "0.1"."""
    text = repr(float(bound))
    return text[:-2] if text.endswith(".0") else text


def exposition(prom: CollectorRegistry) -> bytes:
    """The Prometheus text of `prom`, with Triton's counter headers: prometheus_client names
    a counter family `<name>_total` in its HELP and TYPE lines even when its samples carry no
    suffix, where Triton (and so a Prometheus reading Triton) has `# TYPE <name> counter`."""
    lines = generate_latest(prom).decode().split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("# TYPE ") or not line.endswith("_total counter"):
            continue
        name = line[7:-len(" counter")]
        bare = name[:-len("_total")]
        sample = lines[i + 1] if i + 1 < len(lines) else ""
        if sample.startswith((bare + "{", bare + " ")):
            lines[i] = f"# TYPE {bare} counter"
            if lines[i - 1].startswith(f"# HELP {name} "):
                lines[i - 1] = f"# HELP {bare} " + lines[i - 1][len(f"# HELP {name} "):]
    return "\n".join(lines).encode()


def build_collectors(registry: Registry, *, allow_cpu_metrics: bool = True,
                     allow_gpu_metrics: bool = True, interval_ms: int = 2000,
                     counter_latencies: bool = True, histogram_latencies: bool = False) -> tuple:
    """What a scrape reads, as the --metrics-* flags set it: (the Prometheus registry of the
    server's collectors, the GPU collector or None), the latter for whoever serves the
    registry to close when it stops (see http/metrics_endpoint.py)."""
    interval_s = interval_ms / 1000.0
    prom = CollectorRegistry(auto_describe=False)
    prom.register(ModelMetricsCollector(registry, counter_latencies=counter_latencies,
                                        histogram_latencies=histogram_latencies))
    prom.register(CustomMetricsCollector(registry))
    if allow_cpu_metrics and os.path.exists("/proc/stat"):
        prom.register(Throttled(CpuMetricsCollector(), interval_s))
    gpu = GpuMetricsCollector.open() if allow_gpu_metrics else None
    if gpu is not None:
        prom.register(Throttled(gpu, interval_s))
    return prom, gpu
