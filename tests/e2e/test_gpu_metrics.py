"""Triton's GPU metrics on a real GPU: one series per GPU that NVML lists, labelled with its
UUID, with NVML's values in Triton's units; none with --allow-gpu-metrics=false. A GPU
instance's requests count in its model's series labelled with that GPU's UUID.

Needs nvidia-ml-py and an NVIDIA GPU; skipped elsewhere (test_metrics.py checks that a server
without a GPU exports none of these families)."""

import os
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from shmserve.repository.loader import gpu_count
from tests.conftest import metric_samples, start_server, stop_server

pynvml = pytest.importorskip("pynvml", reason="GPU metrics need nvidia-ml-py (pip install .[gpu])")
if gpu_count() == 0:
    pytest.skip("GPU metrics need an NVIDIA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu

GAUGES = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
          "nv_gpu_power_usage", "nv_gpu_power_limit")
ENERGY = "nv_energy_consumption"


@pytest.fixture(scope="module")
def nvml():
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def uuids(nvml):
    found = []
    for i in range(nvml.nvmlDeviceGetCount()):
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
        found.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
    return found


def _server(tmp_path_factory, *flags):
    repo = tmp_path_factory.mktemp("empty_repo")
    return start_server(str(repo), str(tmp_path_factory.mktemp("gpu_metrics") / "log"),
                        "--metrics-interval-ms", "100", *flags)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = _server(tmp_path_factory)
    yield srv
    stop_server(srv)


def scrape(server) -> dict:
    """{family name: {gpu_uuid: value}} of the GPU families only."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=5) as r:
        samples = metric_samples(r.read().decode())
    out: dict = {}
    for (name, labels), value in samples.items():
        if name in GAUGES or name == ENERGY:
            assert [key for key, _ in labels] == ["gpu_uuid"], (name, labels)
            out.setdefault(name, {})[labels[0][1]] = value
    return out


def test_every_gpu_has_a_series_in_every_family(server, uuids):
    families = scrape(server)
    assert set(families) == {*GAUGES, ENERGY}
    for name, series in families.items():
        assert sorted(series) == sorted(uuids), name
        assert all(uuid.startswith("GPU-") for uuid in series)


def test_values_are_nvmls_in_tritons_units(server, nvml, uuids):
    families = scrape(server)
    for i, uuid in enumerate(uuids):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        assert families["nv_gpu_memory_total_bytes"][uuid] == memory.total
        assert 0 < families["nv_gpu_memory_used_bytes"][uuid] <= memory.total
        assert 0.0 <= families["nv_gpu_utilization"][uuid] <= 1.0
        # NVML's milliwatts are watts here.
        limit_w = nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
        assert families["nv_gpu_power_limit"][uuid] == pytest.approx(limit_w)
        assert 0.0 < families["nv_gpu_power_usage"][uuid] <= 2 * limit_w


def test_energy_counts_joules_since_the_server_started(server, nvml, uuids):
    first = scrape(server)[ENERGY]
    started = time.monotonic()
    time.sleep(1.0)
    second = scrape(server)[ENERGY]
    for i, uuid in enumerate(uuids):
        # An idle GPU still draws tens of watts: a second adds joules, within what the
        # power reading allows.
        assert 0.0 <= first[uuid] < second[uuid]
        watts = nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(i)) / 1000.0
        elapsed = time.monotonic() - started
        assert second[uuid] - first[uuid] <= 3 * watts * (elapsed + 0.2) + 50


def test_allow_gpu_metrics_false_drops_the_gpu_families(tmp_path_factory):
    srv = _server(tmp_path_factory, "--allow-gpu-metrics=false")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        assert "nv_cpu_utilization" in text
        assert not any(name in text for name in (*GAUGES, ENERGY))
    finally:
        stop_server(srv)


IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

IDENTITY_GPU_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
'''


def _model_series(server, family: str, model: str) -> dict:
    """{gpu_uuid or None: value} of one model's series in one family."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=5) as r:
        samples = metric_samples(r.read().decode())
    return {dict(labels).get("gpu_uuid"): value for (name, labels), value in samples.items()
            if name == family and dict(labels)["model"] == model}


@pytest.mark.parametrize("gpu_metrics", [True, False])
def test_a_gpu_instances_requests_count_under_its_gpus_uuid(tmp_path_factory, uuids,
                                                            gpu_metrics):
    """Triton's instance reporters label their series with the instance's GPU; the model's
    own series (pending requests, load time) have none. Without GPU metrics, no labels."""
    repo = tmp_path_factory.mktemp("gpu_model_repo")
    os.makedirs(repo / "identity_gpu" / "1")
    (repo / "identity_gpu" / "config.pbtxt").write_text(IDENTITY_GPU_CONFIG)
    (repo / "identity_gpu" / "1" / "model.py").write_text(IDENTITY)
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("gpu_model_logs") / "log"),
                       f"--allow-gpu-metrics={str(gpu_metrics).lower()}",
                       wait_models=("identity_gpu",))
    try:
        with httpclient.InferenceServerClient(srv.http_url) as client:
            for _ in range(3):
                data = np.arange(4, dtype=np.float32)
                tensor = httpclient.InferInput("INPUT0", [4], "FP32")
                tensor.set_data_from_numpy(data)
                client.infer("identity_gpu", [tensor])
        success = _model_series(srv, "nv_inference_request_success", "identity_gpu")
        executions = _model_series(srv, "nv_inference_exec_count", "identity_gpu")
        pending = _model_series(srv, "nv_inference_pending_request_count", "identity_gpu")
        if not gpu_metrics:
            assert success == {None: 3} and executions == {None: 3}
            return
        (uuid,) = set(success) - {None}
        assert uuid in uuids
        assert success == {None: 0, uuid: 3}
        assert executions == {None: 0, uuid: 3}
        assert pending == {None: 0, uuid: 0}
    finally:
        stop_server(srv)
