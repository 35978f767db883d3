"""An ensemble's intermediate tensors stay on the GPU between GPU steps: the first step's
device output reaches the second step's model as a device tensor (read in place through a CUDA
IPC handle, or directly when one instance runs both steps), and the first instance lets it go
once the second has answered. A CPU step still gets host memory.

Needs cupy and an NVIDIA GPU; skipped elsewhere (tests/unit/workers/test_device_tensors.py and
test_ensemble.py cover the logic with stand-ins)."""

import concurrent.futures
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shmserve.repository.loader import gpu_count
from tests.conftest import start_server, stop_server

pytest.importorskip("cupy", reason="GPU tensors between steps need cupy (pip install .[gpu])")
if gpu_count() == 0:
    pytest.skip("GPU tensors between steps need an NVIDIA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu

CLIENTS = {"http": httpclient, "grpc": grpcclient}
MIB = 1 << 20

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 * 2, made on the GPU by a GPU instance; ON_GPU: whether INPUT0 arrived
    on the GPU; POOL_BYTES: the bytes in arrays of cupy's memory pool as the request runs, where
    arrays the instance keeps and never lets go would add up."""

    def initialize(self, args):
        self.on_gpu = args["model_instance_kind"] == "GPU"

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            pool = 0
            if self.on_gpu:
                import cupy
                data = (cupy.asarray(tensor.as_numpy()) if tensor.is_cpu()
                        else cupy.from_dlpack(tensor))
                out = pb_utils.Tensor.from_dlpack("OUTPUT0", data * 2)
                pool = cupy.get_default_memory_pool().used_bytes()
            else:
                out = pb_utils.Tensor("OUTPUT0", tensor.as_numpy() * 2)
            responses.append(pb_utils.InferenceResponse([
                out, pb_utils.Tensor("ON_GPU", np.array([not tensor.is_cpu()])),
                pb_utils.Tensor("POOL_BYTES", np.array([pool], np.int64))]))
        return responses
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "POOL_BYTES" data_type: TYPE_INT64 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: {kind} }} ]
parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {{ string_value: "no" }} }}
'''

ENSEMBLE = '''
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "FIRST_ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "SECOND_ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "FIRST_POOL_BYTES" data_type: TYPE_INT64 dims: [ 1 ] }}
]
ensemble_scheduling {{ step [
  {{ model_name: "{first}" model_version: -1
     input_map {{ key: "INPUT0" value: "IN" }}
     output_map {{ key: "OUTPUT0" value: "MID" }}
     output_map {{ key: "ON_GPU" value: "FIRST_ON_GPU" }}
     output_map {{ key: "POOL_BYTES" value: "FIRST_POOL_BYTES" }} }},
  {{ model_name: "{second}" model_version: -1
     input_map {{ key: "INPUT0" value: "MID" }}
     output_map {{ key: "OUTPUT0" value: "OUT" }}
     output_map {{ key: "ON_GPU" value: "SECOND_ON_GPU" }} }}
] }}
'''

# ensemble -> (first step, second step, whether the second gets MID on the GPU)
ENSEMBLES = {
    "gpu_to_gpu": ("twice_gpu", "twice_gpu_2", True),
    "gpu_to_itself": ("twice_gpu", "twice_gpu", True),
    "gpu_to_cpu": ("twice_gpu", "twice_cpu", False),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_ensemble_repo")
    for name, kind in (("twice_gpu", "KIND_GPU"), ("twice_gpu_2", "KIND_GPU"),
                       ("twice_cpu", "KIND_CPU")):
        os.makedirs(repo / name / "1")
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, kind=kind))
        (repo / name / "1" / "model.py").write_text(MODEL)
    for name, (first, second, _) in ENSEMBLES.items():
        os.makedirs(repo / name / "1")
        (repo / name / "config.pbtxt").write_text(
            ENSEMBLE.format(name=name, first=first, second=second))
    log = tmp_path_factory.mktemp("gpu_ensemble_logs") / "log"
    srv = start_server(str(repo), str(log), wait_models=tuple(ENSEMBLES))
    yield srv
    stop_server(srv)


def _infer(server, protocol: str, ensemble: str, data: np.ndarray):
    mod = CLIENTS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    client = mod.InferenceServerClient(url)
    try:
        tensor = mod.InferInput("IN", [data.size], "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer(ensemble, [tensor])
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("ensemble", list(ENSEMBLES))
def test_the_intermediate_reaches_a_gpu_step_on_the_gpu(server, protocol, ensemble):
    data = np.arange(MIB // 4, dtype=np.float32)  # 1 MiB: above the inline threshold
    result = _infer(server, protocol, ensemble, data)
    assert np.array_equal(result.as_numpy("OUT"), data * 4)
    assert not result.as_numpy("FIRST_ON_GPU")[0]  # the request's bytes are host memory
    assert bool(result.as_numpy("SECOND_ON_GPU")[0]) is ENSEMBLES[ensemble][2]


@pytest.mark.parametrize("ensemble", ["gpu_to_gpu", "gpu_to_itself"])
def test_the_first_instance_lets_its_kept_outputs_go(server, ensemble):
    data = np.ones(MIB, dtype=np.float32)  # 4 MiB a request
    pools = [int(_infer(server, "grpc", ensemble, data).as_numpy("FIRST_POOL_BYTES")[0])
             for _ in range(30)]
    # Each request's MID would add 4 MiB to the pool if it were kept for good.
    assert max(pools[5:]) - min(pools[5:]) < 4 * MIB, pools


def test_concurrent_requests_each_get_their_own_intermediate(server):
    def one(k):
        data = np.full(MIB // 4, k, dtype=np.float32)
        result = _infer(server, "grpc", "gpu_to_gpu", data)
        return k, result.as_numpy("OUT"), bool(result.as_numpy("SECOND_ON_GPU")[0])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for k, out, on_gpu in pool.map(one, range(32)):
            assert on_gpu and np.array_equal(out, np.full(MIB // 4, 4 * k, np.float32)), k
    assert "cannot be shared on its GPU" not in server.log()
