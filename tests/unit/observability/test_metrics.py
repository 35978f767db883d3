"""Metrics collectors read at scrape time: histograms from ModelStats' integers, GPU metrics
through a fake NVML module (there is no GPU here), sampling throttled by the interval."""

import asyncio
import math
import os
import sys
import threading
import types
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from shmserve.config.parse import parse_config_text
from shmserve.dispatch.worker import WorkerHandle
from shmserve.errors import ServerError
from shmserve.http.metrics_endpoint import MetricsText, build_metrics_server
from shmserve.ipc import messages
from shmserve.observability.metrics import (BATCH_SIZE_BOUNDS, CustomMetricsCollector,
                                            GpuMetricsCollector, ModelMetricsCollector,
                                            Throttled, exposition)
from shmserve.observability.stats import (REQUEST_DURATION_BOUNDS_NS, ModelStats,
                                          first_response_bounds_ms, stats_json)
from shmserve.observability.summaries import SAMPLES_PER_BUCKET, LatencySummaries
from shmserve.registry import Registry
from tests.conftest import metric_samples
from workers import metrics_report
from workers import triton_python_backend_utils as pb_utils
from workers.model_api import metrics as metrics_module

MS = 1_000_000  # ns


class FakeRegistry:
    def __init__(self, *versions):
        self._versions = versions
        self.metric_families = {}

    def all_versions(self):
        return list(self._versions)


def model(name="m", stats=None, instances=None, cache=False, tags=None, decoupled=False):
    pool = None if instances is None else SimpleNamespace(instances=instances)
    config = SimpleNamespace(response_cache=SimpleNamespace(enable=cache),
                             metric_tags=tags or {},
                             model_transaction_policy=SimpleNamespace(decoupled=decoupled))
    return SimpleNamespace(name=name, version=1, load_seconds=0.25, stats=stats or ModelStats(),
                           pool=pool, config=config)


def scrape(*collectors) -> dict:
    """{(sample name, sorted labels): value} of what the collectors expose."""
    prom = CollectorRegistry(auto_describe=False)
    for c in collectors:
        prom.register(c)
    return metric_samples(exposition(prom).decode())


def succeed(stats, request_ns, batch_size=1):
    stats.record_success(batch_size=batch_size, request_ns=request_ns, queue_ns=0,
                         compute_input_ns=0, compute_infer_ns=0, compute_output_ns=0)


def execute(stats, batch_size):
    stats.record_execution(batch_size, SimpleNamespace(compute_input_ns=1, compute_infer_ns=2,
                                                       compute_output_ns=3, gpu_uuid=""))


LABELS = (("model", "m"), ("version", "1"))


def bucket(name, le):
    return (name + "_bucket", tuple(sorted(LABELS + (("le", le),))))


def test_request_duration_histogram_counts_successes_and_failures():
    stats = ModelStats()
    succeed(stats, 50_000)          # 50 us: first bucket
    succeed(stats, 100_000)         # exactly on the first bound: still the first bucket (le)
    succeed(stats, 3 * MS)          # 3 ms: the 5 ms bucket
    stats.record_failure(700 * MS, "BACKEND")
    stats.record_failure(120_000 * MS, "OTHER")  # 2 min: past the last bound
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    name = "shmserve_inference_request_duration_seconds"
    assert out[bucket(name, "0.0001")] == 2
    assert out[bucket(name, "0.0025")] == 2
    assert out[bucket(name, "0.005")] == 3
    assert out[bucket(name, "1.0")] == 4
    assert out[bucket(name, "60.0")] == 4
    assert out[bucket(name, "+Inf")] == 5
    assert out[(name + "_count", LABELS)] == 5
    assert out[(name + "_sum", LABELS)] == pytest.approx((150_000 + 3 * MS + 120_700 * MS) / 1e9)
    les = [le for (n, labels) in out if n == name + "_bucket"
           for k, le in labels if k == "le"]
    assert len(les) == len(REQUEST_DURATION_BOUNDS_NS) + 1


def test_batch_size_histogram_from_executions():
    stats = ModelStats()
    for size in (1, 1, 3, 8, 2000):
        execute(stats, size)
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    name = "shmserve_inference_batch_size"
    assert out[bucket(name, "1")] == 2
    assert out[bucket(name, "2")] == 2
    assert out[bucket(name, "4")] == 3
    assert out[bucket(name, "8")] == 4
    assert out[bucket(name, str(BATCH_SIZE_BOUNDS[-1]))] == 4
    assert out[bucket(name, "+Inf")] == 5
    assert out[(name + "_sum", LABELS)] == 2013
    assert out[("nv_inference_exec_count", LABELS)] == 5


def test_triton_counters_keep_their_names_and_reasons():
    stats = ModelStats()
    succeed(stats, 2 * MS, batch_size=4)
    stats.record_failure(1 * MS, "REJECTED")
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    assert out[("nv_inference_request_success", LABELS)] == 1
    assert out[("nv_inference_count", LABELS)] == 4
    assert out[("nv_inference_request_duration_us", LABELS)] == 3000
    assert out[("nv_model_load_duration_secs", LABELS)] == 0.25
    failures = {dict(labels)["reason"]: v for (n, labels), v in out.items()
                if n == "nv_inference_request_failure"}
    assert failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


def test_metric_tags_label_every_series_of_their_model():
    stats = ModelStats()
    succeed(stats, 2 * MS)
    execute(stats, 1)
    tagged = model("t", stats=stats, cache=True, tags={"team": "search", "tier": "gold"})
    out = scrape(ModelMetricsCollector(FakeRegistry(tagged, model("plain"))))
    key = (("_team", "search"), ("_tier", "gold"), ("model", "t"), ("version", "1"))
    assert out[("nv_inference_request_success", key)] == 1
    assert out[("nv_inference_exec_count", key)] == 1
    assert out[("nv_cache_num_hits_per_model", key)] == 0
    assert out[("shmserve_inference_batch_size_count", key)] == 1
    assert out[("nv_inference_request_failure", tuple(sorted(key + (("reason", "OTHER"),))))] == 0
    assert out[("nv_inference_request_success", (("model", "plain"), ("version", "1")))] == 0
    series = [labels for (name, labels) in out if dict(labels).get("model") == "t"]
    assert series and all(dict(labels)["_team"] == "search" for labels in series)


# --- GPU metrics through a fake NVML ----------------------------------------------------------

class NVMLError(Exception):
    pass


def fake_nvml(gpus, fail=(), init_error=False):
    """A stand-in for nvidia-ml-py's `pynvml` module; `gpus` is a list of dicts of readings
    in NVML's units, `fail` the names of the functions that raise NVMLError."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.calls = []

    def call(name, result):
        def fn(*args):
            m.calls.append(name)
            if name in fail:
                raise NVMLError(name)
            return result(*args)
        return fn

    def init():
        m.calls.append("nvmlInit")
        if init_error:
            raise NVMLError("Driver Not Loaded")
    m.nvmlInit = init
    m.nvmlShutdown = call("nvmlShutdown", lambda: None)
    m.nvmlDeviceGetCount = call("nvmlDeviceGetCount", lambda: len(gpus))
    m.nvmlDeviceGetHandleByIndex = call("nvmlDeviceGetHandleByIndex", lambda i: gpus[i])
    m.nvmlDeviceGetUUID = call("nvmlDeviceGetUUID", lambda g: g["uuid"])
    m.nvmlDeviceGetUtilizationRates = call("nvmlDeviceGetUtilizationRates",
                                           lambda g: SimpleNamespace(gpu=g["util"], memory=0))
    m.nvmlDeviceGetMemoryInfo = call("nvmlDeviceGetMemoryInfo",
                                     lambda g: SimpleNamespace(total=g["total"], used=g["used"],
                                                               free=g["total"] - g["used"]))
    m.nvmlDeviceGetPowerUsage = call("nvmlDeviceGetPowerUsage", lambda g: g["mw"])
    m.nvmlDeviceGetPowerManagementLimit = call("nvmlDeviceGetPowerManagementLimit",
                                               lambda g: g["limit_mw"])
    m.nvmlDeviceGetTotalEnergyConsumption = call("nvmlDeviceGetTotalEnergyConsumption",
                                                 lambda g: g["mj"])
    return m


def gpu(uuid, **readings):
    return dict(dict(uuid=uuid, util=50, total=80 << 30, used=1 << 30, mw=123_456,
                     limit_mw=700_000, mj=5_000_000), **readings)


@pytest.fixture
def install_nvml(monkeypatch):
    def install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module
    return install


def test_gpu_metrics_in_triton_units(install_nvml):
    gpus = [gpu("GPU-aaaa"), gpu(b"GPU-bbbb", util=100)]  # older releases give bytes
    install_nvml(fake_nvml(gpus))
    collector = GpuMetricsCollector.open()
    gpus[0]["mj"] += 2500  # 2.5 J used since the server started
    out = scrape(collector)
    a, b = (("gpu_uuid", "GPU-aaaa"),), (("gpu_uuid", "GPU-bbbb"),)
    assert out[("nv_gpu_utilization", a)] == 0.5
    assert out[("nv_gpu_utilization", b)] == 1.0
    assert out[("nv_gpu_memory_total_bytes", a)] == 80 << 30
    assert out[("nv_gpu_memory_used_bytes", a)] == 1 << 30
    assert out[("nv_gpu_power_usage", a)] == pytest.approx(123.456)
    assert out[("nv_gpu_power_limit", a)] == 700.0
    assert out[("nv_energy_consumption", a)] == 2.5
    assert out[("nv_energy_consumption", b)] == 0.0


def test_a_reading_nvml_refuses_is_left_out(install_nvml):
    install_nvml(fake_nvml([gpu("GPU-aaaa")], fail={"nvmlDeviceGetPowerUsage",
                                                    "nvmlDeviceGetTotalEnergyConsumption"}))
    out = scrape(GpuMetricsCollector.open())
    names = {n for n, _ in out}
    assert "nv_gpu_power_usage" not in names and "nv_energy_consumption" not in names
    assert out[("nv_gpu_utilization", (("gpu_uuid", "GPU-aaaa"),))] == 0.5


def test_no_collector_without_nvml_or_gpus(install_nvml, monkeypatch):
    no_gpus = install_nvml(fake_nvml([]))
    assert GpuMetricsCollector.open() is None
    assert no_gpus.calls[-1] == "nvmlShutdown"
    install_nvml(fake_nvml([gpu("GPU-aaaa")], init_error=True))
    assert GpuMetricsCollector.open() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: not installed
    assert GpuMetricsCollector.open() is None


class Counting:
    def __init__(self):
        self.reads = 0

    def collect(self):
        self.reads += 1
        return iter(())


def test_throttled_reads_at_most_once_per_interval(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("shmserve.observability.metrics.time.monotonic", lambda: now[0])
    inner = Counting()
    throttled = Throttled(inner, 2.0)
    list(throttled.collect())
    now[0] += 1.9
    list(throttled.collect())
    assert inner.reads == 1
    now[0] += 0.1
    list(throttled.collect())
    assert inner.reads == 2


def serve_and_scrape(server) -> str:
    """GET /metrics from the metrics server on a free port, then stop it."""
    async def main():
        await server.start("127.0.0.1", 0)
        try:
            port = server.port
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = await reader.read()
            writer.close()
        finally:
            await server.stop(grace=1.0)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        return body.decode()
    return asyncio.run(main())


def test_endpoint_flags(install_nvml):
    nvml = install_nvml(fake_nvml([gpu("GPU-aaaa")]))
    text = serve_and_scrape(build_metrics_server(MetricsText(FakeRegistry(model()))))
    assert "nv_cpu_utilization" in text and 'nv_gpu_utilization{gpu_uuid="GPU-aaaa"}' in text
    assert nvml.calls[-1] == "nvmlShutdown"  # when the server stops
    nvml.calls.clear()
    metrics = MetricsText(FakeRegistry(model()), allow_cpu_metrics=False,
                          allow_gpu_metrics=False)
    text = serve_and_scrape(build_metrics_server(metrics))
    assert "nv_cpu_" not in text and "nv_gpu_" not in text and not nvml.calls
    assert 'nv_inference_request_success{model="m",version="1"}' in text


def instance(*families):
    return SimpleNamespace(custom_metrics=list(families))


def test_custom_metrics_add_up_across_instances_and_a_gauge_shows_its_latest_set():
    bounds = [0.1, 1.0]
    first = instance(
        ["requests", "Requests seen", 0, [[{"kind": "a"}, 2.0, 10.0], [{"kind": "b"}, 1.0, 10.0]]],
        ["depth", "Queue depth", 1, [[{}, 5.0, 10.0]]],
        ["latency", "Latency", 2, [[{}, [bounds, [1, 0, 1], 2.05, 2], 10.0]]])
    second = instance(
        ["requests", "Requests seen", 0, [[{"kind": "a"}, 3.0, 11.0]]],
        ["depth", "Queue depth", 1, [[{}, 7.0, 12.0]]],
        ["latency", "Latency", 2, [[{}, [bounds, [0, 1, 0], 0.5, 1], 11.0]]],
        ["requests_gauge_clash", "x", 1, []])
    other_model = instance(["depth", "Queue depth", 1, [[{}, 6.0, 11.5]]])
    samples = scrape(CustomMetricsCollector(FakeRegistry(
        model("m", instances=[first, second]), model("n", instances=[other_model]), model("o"))))
    assert samples[("requests", (("kind", "a"),))] == 5.0
    assert samples[("requests", (("kind", "b"),))] == 1.0
    assert samples[("depth", ())] == 7.0  # set last (t=12) by the second instance
    buckets = {labels: v for (name, labels), v in samples.items() if name == "latency_bucket"}
    assert buckets == {(("le", "0.1"),): 1.0, (("le", "1"),): 2.0, (("le", "+Inf"),): 3.0}
    assert samples[("latency_count", ())] == 3.0
    assert samples[("latency_sum", ())] == pytest.approx(2.55)
    # The reports were not changed by adding them up.
    assert first.custom_metrics[2][3][0][1][1] == [1, 0, 1]


def test_a_family_shows_as_first_declared_and_only_while_it_has_series():
    """As Triton's registry: a name keeps the first kind and description any model gave it,
    another kind is refused, and a family without series does not show."""
    registry = Registry()
    registry.declare_metric_family("f", "first words", 0)
    registry.declare_metric_family("f", "later words", 0)
    with pytest.raises(ServerError, match="^Family name already exists with different type$"):
        registry.declare_metric_family("f", "first words", 1)
    registry.declare_metric_family("empty", "e", 1)
    fake = FakeRegistry(model("m", instances=[instance(["f", "later words", 0, [[{}, 1.0, 1.0]]],
                                                       ["empty", "e", 1, []])]))
    fake.metric_families = registry.metric_families
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CustomMetricsCollector(fake))
    text = exposition(prom).decode()
    assert "# HELP f first words\n# TYPE f counter\nf 1.0\n" in text
    assert "empty" not in text


def handle():
    return WorkerHandle(model_name="m", model_version=1, model_dir="", model_repository="",
                        model_config={}, instance_name="m_0", instance_kind="CPU", device_id=0)


def test_a_scrape_waits_for_the_answer_to_its_own_ask():
    async def main():
        worker = handle()
        worker._loop = asyncio.get_running_loop()
        worker.alive = True
        worker._metrics.fd = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            first = asyncio.ensure_future(worker.fresh_custom_metrics(5))
            await asyncio.sleep(0)
            second = asyncio.ensure_future(worker.fresh_custom_metrics(5))
            await asyncio.sleep(0)
            assert os.eventfd_read(worker._metrics.fd) == 2  # one write per ask
            families = [["f", "d", 0, [[{}, 1.0, 1.0]]]]
            worker._on_message(messages.MetricsReport(1, families))  # the first ask's answer
            await asyncio.wait_for(first, 1)
            assert not second.done() and worker.custom_metrics == families
            worker._on_message(messages.MetricsReport(2, None))  # unchanged since
            await asyncio.wait_for(second, 1)
            assert worker.custom_metrics == families
            # A worker that does not answer: the scrape goes on with its last values.
            await asyncio.wait_for(worker.fresh_custom_metrics(0.05), 1)
            assert not worker._metrics.waiters
            # One whose process is gone answers every waiting scrape at once.
            third = asyncio.ensure_future(worker.fresh_custom_metrics(5))
            await asyncio.sleep(0)
            worker._metrics.wake()
            await asyncio.wait_for(third, 1)
        finally:
            os.close(worker._metrics.fd)
    asyncio.run(main())


class Sent:
    def __init__(self):
        self.frames = []
        self.arrived = threading.Semaphore(0)
        self.closed = False

    def send(self, msg):
        if self.closed:
            self.arrived.release()
            raise BrokenPipeError  # the front is gone: the thread ends
        self.frames.append(msg)
        self.arrived.release()


def test_the_workers_metrics_thread_answers_each_ask_with_values_as_they_are(monkeypatch):
    monkeypatch.setattr(metrics_module, "_registry", {})
    family = pb_utils.MetricFamily("g", "gauge", pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric(labels={"k": "v"})
    channel, fd = Sent(), os.eventfd(0)
    try:
        metrics_report.start(channel, fd)
        gauge.set(3)
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        assert channel.frames[-1].answered == 1
        assert channel.frames[-1].families[0][3][0][:2] == [{"k": "v"}, 3.0]
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        assert (channel.frames[-1].answered, channel.frames[-1].families) == (2, None)
        gauge.set(4)
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        assert channel.frames[-1].families[0][3][0][1] == 4.0
    finally:
        channel.closed = True
        os.eventfd_write(fd, 1)
        assert channel.arrived.acquire(timeout=5)
        os.close(fd)


def test_cache_counters_show_only_for_models_that_enable_the_cache():
    cached = model("c", cache=True)
    cached.stats.cache_hit.add(3_000, 2)
    cached.stats.cache_miss.add(5_000, 1)
    samples = scrape(ModelMetricsCollector(FakeRegistry(cached, model("plain"))))
    key = (("model", "c"), ("version", "1"))
    assert samples[("nv_cache_num_hits_per_model", key)] == 2
    assert samples[("nv_cache_num_misses_per_model", key)] == 1
    assert samples[("nv_cache_hit_duration_per_model", key)] == 3
    assert samples[("nv_cache_miss_duration_per_model", key)] == 5
    assert ("nv_cache_num_hits_per_model", (("model", "plain"), ("version", "1"))) not in samples
    samples = scrape(ModelMetricsCollector(FakeRegistry(model("plain"))))
    assert not any(name.startswith("nv_cache_") for name, _ in samples)


def test_counter_headers_name_the_counter_as_its_samples_do():
    stats = ModelStats()
    succeed(stats, 1000)
    prom = CollectorRegistry(auto_describe=False)
    prom.register(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    text = exposition(prom).decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert "# HELP nv_inference_request_success Number of successful" in text
    assert "_total" not in text
    assert text == exposition(prom).decode()  # nothing else changes between scrapes


def test_metrics_config_switches_the_latency_counters_and_the_first_response_histogram():
    stats = ModelStats()
    succeed(stats, 1000)
    stats.record_first_response(150 * MS)
    stats.record_first_response(6000 * MS)
    default = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    assert any(n == "nv_inference_request_duration_us" for n, _ in default)
    assert not any(n.startswith("nv_inference_first_response") for n, _ in default)
    switched = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats, decoupled=True)),
                                            counter_latencies=False, histogram_latencies=True))
    assert not any(n.endswith("_duration_us") for n, _ in switched)
    buckets = {dict(labels)["le"]: v for (n, labels), v in switched.items()
               if n == "nv_inference_first_response_histogram_ms_bucket"}
    assert buckets == {"100": 0, "500": 1, "2000": 1, "5000": 1, "+Inf": 2}
    key = (("model", "m"), ("version", "1"))
    assert switched[("nv_inference_first_response_histogram_ms_sum", key)] == 6150
    assert switched[("nv_inference_first_response_histogram_ms_count", key)] == 2


def test_every_model_has_a_first_response_histogram():
    """As in Triton since 2.65 (2.51 created it for decoupled models only)."""
    versions = FakeRegistry(model("plain"), model("stream", decoupled=True))
    out = scrape(ModelMetricsCollector(versions, histogram_latencies=True))
    models = {dict(labels)["model"] for n, labels in out
              if n == "nv_inference_first_response_histogram_ms_count"}
    assert models == {"plain", "stream"}


def test_model_metrics_set_the_first_response_buckets():
    config = parse_config_text('''
        backend: "python"
        model_metrics { metric_control [
          { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
            histogram_options { buckets: [ 1, 0.5, 50 ] } },
          { metric_identifier { family: "some_other_family" }
            histogram_options { buckets: [ 7 ] } } ] }''')
    assert first_response_bounds_ms(config) == (0.5, 1.0, 50.0)
    default = first_response_bounds_ms(parse_config_text('backend: "python"'))
    assert default == (100, 500, 2000, 5000)
    stats = ModelStats(first_response_bounds_ms=first_response_bounds_ms(config))
    for ms in (0.2, 0.5, 3, 3, 80):
        stats.record_first_response(int(ms * MS))
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats, decoupled=True)),
                                       histogram_latencies=True))
    buckets = {dict(labels)["le"]: v for (n, labels), v in out.items()
               if n == "nv_inference_first_response_histogram_ms_bucket"}
    assert buckets == {"0.5": 2, "1": 2, "50": 4, "+Inf": 5}


def test_latency_summaries_read_quantiles_of_the_last_minute():
    now = [0.0]
    stats = ModelStats(summaries=LatencySummaries(((0.5, 0.05), (0.99, 0.001)),
                                                  clock=lambda: now[0]))
    for ms in range(1, 101):
        stats.record_success(batch_size=1, request_ns=ms * MS, queue_ns=2 * ms * MS,
                             compute_input_ns=0, compute_infer_ns=ms * MS, compute_output_ns=0)
    stats.record_cache_hit(request_ns=50 * MS, lookup_ns=MS)
    samples = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    key = (("model", "m"), ("version", "1"))

    def quantile(kind, q):
        return samples[(f"nv_inference_{kind}_summary_us", (*key[:1], ("quantile", q), *key[1:]))]

    assert quantile("request", "0.5") == 50_000 and quantile("request", "0.99") == 99_000
    assert quantile("queue", "0.5") == 100_000
    assert samples[("nv_inference_request_summary_us_count", key)] == 101  # the cached one too
    assert samples[("nv_inference_queue_summary_us_count", key)] == 100
    assert samples[("nv_inference_compute_infer_summary_us_sum", key)] == 5050 * 1000
    # A minute later the window is empty: NaN quantiles, cumulative count and sum.
    now[0] = 61.0
    later = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    assert later[("nv_inference_request_summary_us_count", key)] == 101
    assert math.isnan(later[("nv_inference_request_summary_us",
                             (("model", "m"), ("quantile", "0.5"), ("version", "1")))])
    # Without summary_latencies there are none.
    assert not any("summary" in n for n, _ in scrape(
        ModelMetricsCollector(FakeRegistry(model(stats=ModelStats())))))


def test_summaries_keep_a_bounded_sample_of_a_busy_minute():
    now = [0.0]
    summaries = LatencySummaries(clock=lambda: now[0])
    for i in range(50_000):
        summaries.observe(i * 1000, 0, 0, 0, 0)  # 0 .. 49,999 us, uniform
    count, total, quantiles = summaries.read("request")
    assert count == 50_000 and total == sum(range(50_000))
    assert len(summaries.windows["request"]._buckets[-1].samples) == SAMPLES_PER_BUCKET
    for q, got in quantiles:
        assert abs(got / 50_000 - q) < 0.04, (q, got)
    # Older age buckets leave the window one by one: the newest observations decide.
    now[0] = 13.0
    for _ in range(1000):
        summaries.observe(10 ** 9, 0, 0, 0, 0)  # 1,000,000 us
    assert dict(summaries.read("request")[2])[0.999] == 1_000_000
    now[0] = 62.0
    assert dict(summaries.read("request")[2])[0.5] == 1_000_000


GPU_A = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
GPU_B = "GPU-ffffffff-0000-1111-2222-333344445555"


def on_gpu(uuid):
    return SimpleNamespace(compute_input_ns=1, compute_infer_ns=2, compute_output_ns=3,
                           gpu_uuid=uuid)


def test_gpu_instances_count_under_their_gpus_uuid_and_the_rest_under_the_model():
    """As Triton's reporters: each GPU's instances have series labelled `gpu_uuid`; the
    model's own series count what ran elsewhere (a CPU instance, a failed read), the queue
    and the load time. The statistics extension still counts all of it once."""
    stats = ModelStats(per_device=True)
    for uuid, ns in ((GPU_A, 10_000), (GPU_A, 20_000), ("", 5_000)):
        stats.record_execution(2, on_gpu(uuid))
        stats.record_success(batch_size=2, request_ns=ns, queue_ns=1000, compute_input_ns=1,
                             compute_infer_ns=2, compute_output_ns=3, device=uuid)
    stats.record_failure(7_000, "BACKEND", GPU_A)
    stats.record_failure(3_000, "REJECTED")
    stats.pending = 4
    instances = [SimpleNamespace(gpu_uuid=GPU_A, custom_metrics=[]),
                 SimpleNamespace(gpu_uuid=GPU_B, custom_metrics=[]),
                 SimpleNamespace(gpu_uuid="", custom_metrics=[])]
    stats.cache_hit.add(2_000)
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats, instances=instances,
                                                          cache=True))))

    def series(name, **extra):
        return {dict(labels).get("gpu_uuid"): v for (n, labels), v in out.items()
                if n == name and all(dict(labels).get(k) == x for k, x in extra.items())}

    assert series("nv_inference_request_success") == {None: 1, GPU_A: 2, GPU_B: 0}
    assert series("nv_inference_count") == {None: 2, GPU_A: 4, GPU_B: 0}
    assert series("nv_inference_exec_count") == {None: 1, GPU_A: 2, GPU_B: 0}
    assert series("nv_inference_request_failure", reason="BACKEND") == {None: 0, GPU_A: 1,
                                                                         GPU_B: 0}
    assert series("nv_inference_request_failure", reason="REJECTED") == {None: 1, GPU_A: 0,
                                                                          GPU_B: 0}
    assert series("nv_inference_request_duration_us") == {None: 8, GPU_A: 37, GPU_B: 0}
    assert series("nv_inference_queue_duration_us") == {None: 1, GPU_A: 2, GPU_B: 0}
    assert series("nv_inference_pending_request_count") == {None: 4, GPU_A: 0, GPU_B: 0}
    assert series("nv_model_load_duration_secs") == {None: 0.25, GPU_A: 0, GPU_B: 0}
    assert series("nv_cache_num_hits_per_model") == {None: 1, GPU_A: 0, GPU_B: 0}
    # shmserve's own histograms stay one per version.
    assert series("shmserve_inference_batch_size_count") == {None: 3}
    whole = stats_json(SimpleNamespace(name="m", version=1), stats)
    assert whole["inference_count"] == 6 and whole["execution_count"] == 3
    assert whole["inference_stats"]["success"]["count"] == 3


def test_without_gpu_labels_a_gpu_instances_work_counts_under_the_model():
    """--allow-gpu-metrics=false (or no metrics): Triton finds no UUID, so no label."""
    stats = ModelStats()
    stats.record_execution(1, on_gpu(GPU_A))
    succeed_on = dict(batch_size=1, request_ns=1000, queue_ns=0, compute_input_ns=0,
                      compute_infer_ns=0, compute_output_ns=0, device=GPU_A)
    stats.record_success(**succeed_on)
    stats.record_failure(1000, "BACKEND", GPU_A)
    instances = [SimpleNamespace(gpu_uuid=GPU_A, custom_metrics=[])]
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats, instances=instances))))
    assert not any("gpu_uuid" in dict(labels) for _, labels in out)
    assert out[("nv_inference_request_success", LABELS)] == 1
    assert stats.devices == {}


def test_a_gpu_instances_durations_go_to_its_own_summaries():
    stats = ModelStats(per_device=True,
                       summaries=LatencySummaries(((0.5, 0.05),), clock=lambda: 0.0))
    stats.record_success(batch_size=1, request_ns=MS, queue_ns=0, compute_input_ns=0,
                         compute_infer_ns=0, compute_output_ns=0, device=GPU_A)
    for _ in range(2):
        stats.record_success(batch_size=1, request_ns=3 * MS, queue_ns=0, compute_input_ns=0,
                             compute_infer_ns=0, compute_output_ns=0)
    out = scrape(ModelMetricsCollector(FakeRegistry(model(stats=stats))))
    counts = {dict(labels).get("gpu_uuid"): v for (n, labels), v in out.items()
              if n == "nv_inference_request_summary_us_count"}
    assert counts == {None: 2, GPU_A: 1}
    median = {dict(labels).get("gpu_uuid"): v for (n, labels), v in out.items()
              if n == "nv_inference_request_summary_us" and dict(labels)["quantile"] == "0.5"}
    assert median == {None: 3000, GPU_A: 1000}


def test_a_gpu_worker_names_its_gpu_as_nvml_does(monkeypatch):
    """The worker asks the CUDA driver (here a stand-in: no GPU) for its device's UUID."""
    import ctypes
    from workers import cuda

    raw = bytes.fromhex("0a1b2c3d00001111222233334444ff55")
    asked = []

    class FakeDriver:
        @staticmethod
        def cuInit(flags):
            return 0

        @staticmethod
        def cuDeviceGet(handle, ordinal):
            asked.append(ordinal)
            handle._obj.value = 40 + ordinal
            return 0 if ordinal < 2 else 101  # CUDA_ERROR_INVALID_DEVICE

        @staticmethod
        def cuDeviceGetUuid(out, handle):
            assert handle.value == 41
            ctypes.memmove(out, raw, 16)
            return 0

    monkeypatch.setattr(cuda, "_libcuda", lambda: FakeDriver)
    assert cuda.gpu_uuid(1) == "GPU-0a1b2c3d-0000-1111-2222-33334444ff55"
    assert cuda.gpu_uuid(5) == ""
    assert asked == [1, 5]
    monkeypatch.setattr(cuda, "_libcuda", lambda: None)
    assert cuda.gpu_uuid(0) == ""

    class OldDriver:  # ctypes raises AttributeError for a symbol the library lacks
        cuInit = staticmethod(FakeDriver.cuInit)
        cuDeviceGet = staticmethod(FakeDriver.cuDeviceGet)

    monkeypatch.setattr(cuda, "_libcuda", lambda: OldDriver)
    assert cuda.gpu_uuid(1) == ""
