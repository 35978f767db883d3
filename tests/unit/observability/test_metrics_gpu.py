"""GPU metrics: read through a fake NVML module (there is no GPU here) in Triton's units, the
readings NVML refuses left out, no collector without NVML or GPUs; sampling throttled by the
interval; the metrics endpoint's CPU and GPU switches; the series of a GPU instance's work
labelled with its GPU's UUID (and its own summaries), and the worker naming its GPU as NVML
does."""

import asyncio
import sys
import types
from types import SimpleNamespace

import pytest

from shmserve.http.metrics_endpoint import MetricsText, build_metrics_server
from shmserve.observability.metrics import GpuMetricsCollector, ModelMetricsCollector, Throttled
from shmserve.observability.stats import ModelStats, stats_json
from shmserve.observability.summaries import LatencySummaries
from tests.unit.observability.metrics_helpers import LABELS, MS, FakeRegistry, model, scrape


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


# --- sampling, and the endpoint's switches ----------------------------------------------------


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


# --- a GPU instance's series ------------------------------------------------------------------


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
