"""Prometheus metrics with Triton's names, collected from the per-model statistics at
scrape time (the request path only bumps integers in `stats.ModelStats`)."""

import os

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from shmserve.registry import Registry

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class CounterMetricFamily(Metric):
    """A counter exposed under exactly its name: Triton's counters carry no `_total`
    suffix, which prometheus_client's own CounterMetricFamily would add."""

    def __init__(self, name: str, documentation: str, labels: list):
        super().__init__(name, documentation, "counter")
        self._labels = labels

    def add_metric(self, values: list, value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labels, values)), value)


class ModelMetricsCollector:
    def __init__(self, registry: Registry):
        self._registry = registry

    def collect(self):
        labels = ["model", "version"]
        success = CounterMetricFamily("nv_inference_request_success",
                                      "Number of successful inference requests, all batch sizes", labels=labels)
        failure = CounterMetricFamily("nv_inference_request_failure",
                                      "Number of failed inference requests, all batch sizes",
                                      labels=labels + ["reason"])
        count = CounterMetricFamily("nv_inference_count",
                                    "Number of inferences performed (does not include cached requests)", labels=labels)
        exec_count = CounterMetricFamily("nv_inference_exec_count",
                                         "Number of model executions performed (does not include cached requests)", labels=labels)
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.", labels=labels)
        durations = {
            "request": CounterMetricFamily("nv_inference_request_duration_us",
                                           "Cumulative inference request duration in microseconds (includes cached requests)", labels=labels),
            "queue": CounterMetricFamily("nv_inference_queue_duration_us",
                                         "Cumulative inference queuing duration in microseconds (includes cached requests)", labels=labels),
            "compute_input": CounterMetricFamily("nv_inference_compute_input_duration_us",
                                                 "Cumulative compute input duration in microseconds (does not include cached requests)", labels=labels),
            "compute_infer": CounterMetricFamily("nv_inference_compute_infer_duration_us",
                                                 "Cumulative compute inference duration in microseconds (does not include cached requests)", labels=labels),
            "compute_output": CounterMetricFamily("nv_inference_compute_output_duration_us",
                                                  "Cumulative inference compute output duration in microseconds (does not include cached requests)", labels=labels),
        }
        load = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds", labels=labels)
        for mv in self._registry.all_versions():
            lv = [mv.name, str(mv.version)]
            load.add_metric(lv, mv.load_seconds)
            s = mv.stats
            success.add_metric(lv, s.success.count)
            for reason in FAILURE_REASONS:
                failure.add_metric(lv + [reason], s.failures.get(reason, 0))
            count.add_metric(lv, s.inference_count)
            exec_count.add_metric(lv, s.execution_count)
            pending.add_metric(lv, s.pending)
            durations["request"].add_metric(lv, (s.success.ns + s.fail.ns) // 1000)
            durations["queue"].add_metric(lv, s.queue.ns // 1000)
            durations["compute_input"].add_metric(lv, s.compute_input.ns // 1000)
            durations["compute_infer"].add_metric(lv, s.compute_infer.ns // 1000)
            durations["compute_output"].add_metric(lv, s.compute_output.ns // 1000)
        yield from (success, failure, count, exec_count, pending, *durations.values(), load)


class CpuMetricsCollector:
    """nv_cpu_* gauges read from /proc, as Triton reports them."""

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


def build_metrics_app(registry: Registry) -> web.Application:
    prom = CollectorRegistry(auto_describe=False)
    prom.register(ModelMetricsCollector(registry))
    if os.path.exists("/proc/stat"):
        prom.register(CpuMetricsCollector())

    async def metrics(request):
        return web.Response(body=generate_latest(prom),
                            headers={"Content-Type": "text/plain; charset=utf-8"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/", metrics)
    return app
