"""CUDA shared memory on a real GPU: a client's device buffer, shared by its IPC handle, is
read by a GPU model in place and the output is written into the client's device buffer.

Needs cupy and an NVIDIA GPU; skipped elsewhere (the registration checks that need no GPU are
in test_shared_memory.py)."""

import base64
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shmserve.repository.loader import gpu_count
from tests.conftest import start_server, stop_server

cupy = pytest.importorskip("cupy", reason="CUDA shared memory needs cupy (pip install .[gpu])")
if gpu_count() == 0:
    pytest.skip("CUDA shared memory needs an NVIDIA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu

# Whole cudaMalloc allocations, as tritonclient's cuda_shared_memory makes: an IPC handle names
# an allocation, and a pooled array may start inside one.
cupy.cuda.set_allocator(None)

CLIENTS = {"http": httpclient, "grpc": grpcclient}

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 * 2, computed on the GPU by a GPU instance (so its output is device
    memory) and on the CPU by a CPU one; ON_GPU says whether the input arrived on the GPU."""

    def initialize(self, args):
        self.on_gpu = args["model_instance_kind"] == "GPU"

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if not tensor.is_cpu():
                import cupy
                doubled = pb_utils.Tensor.from_dlpack("OUTPUT0", cupy.from_dlpack(tensor) * 2)
            elif self.on_gpu:
                import cupy
                doubled = pb_utils.Tensor.from_dlpack("OUTPUT0",
                                                      cupy.asarray(tensor.as_numpy()) * 2)
            else:
                doubled = pb_utils.Tensor("OUTPUT0", tensor.as_numpy() * 2)
            responses.append(pb_utils.InferenceResponse([
                doubled, pb_utils.Tensor("ON_GPU", np.array([not tensor.is_cpu()]))]))
        return responses
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: {kind} }} ]
{parameters}
'''


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cuda_repo")
    gpu_inputs = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'
    for name, kind, parameters in (("double_gpu", "KIND_GPU", gpu_inputs),
                                   ("double_gpu_host_inputs", "KIND_GPU", ""),
                                   ("double_cpu", "KIND_CPU", "")):
        os.makedirs(repo / name / "1")
        (repo / name / "config.pbtxt").write_text(
            CONFIG.format(name=name, kind=kind, parameters=parameters))
        (repo / name / "1" / "model.py").write_text(MODEL)
    srv = start_server(str(repo), str(tmp_path_factory.mktemp("cuda_logs") / "log"),
                       wait_models=("double_gpu", "double_gpu_host_inputs", "double_cpu"))
    yield srv
    stop_server(srv)


def _handle(array) -> bytes:
    """The base64 of the IPC handle of a cupy array's allocation, as tritonclient takes it."""
    return base64.b64encode(cupy.cuda.runtime.ipcGetMemHandle(array.data.ptr))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model, on_gpu", [("double_gpu", True),
                                           ("double_gpu_host_inputs", False),
                                           ("double_cpu", False)])
def test_cuda_regions_in_and_out(gpu_server, protocol, model, on_gpu):
    mod = CLIENTS[protocol]
    url = gpu_server.http_url if protocol == "http" else gpu_server.grpc_url
    client = mod.InferenceServerClient(url)
    data = cupy.arange(1, 9, dtype=cupy.float32)
    out = cupy.zeros(16, dtype=cupy.float32)  # larger than needed: the output fills its start
    try:
        client.register_cuda_shared_memory("in", _handle(data), 0, data.nbytes)
        client.register_cuda_shared_memory("out", _handle(out), 0, out.nbytes)
        status = client.get_cuda_shared_memory_status()
        if protocol == "http":
            assert sorted(r["name"] for r in status) == ["in", "out"]
        else:
            assert sorted(status.regions) == ["in", "out"]
        tensor = mod.InferInput("INPUT0", [8], "FP32")
        tensor.set_shared_memory("in", data.nbytes)
        requested = mod.InferRequestedOutput("OUTPUT0")
        requested.set_shared_memory("out", out.nbytes)
        result = client.infer(model, [tensor], outputs=[requested,
                                                          mod.InferRequestedOutput("ON_GPU")])
        assert bool(result.as_numpy("ON_GPU")[0]) is on_gpu
        cupy.cuda.runtime.deviceSynchronize()
        assert np.array_equal(cupy.asnumpy(out[:8]), np.arange(1, 9, dtype=np.float32) * 2)
        assert np.array_equal(cupy.asnumpy(data), np.arange(1, 9, dtype=np.float32))
    finally:
        client.unregister_cuda_shared_memory()
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["double_gpu", "double_gpu_host_inputs", "double_cpu"])
def test_gpu_outputs_reach_a_client_without_regions(gpu_server, protocol, model):
    """Inputs from the request body are host memory; a GPU instance's device output is copied
    back into the response."""
    mod = CLIENTS[protocol]
    url = gpu_server.http_url if protocol == "http" else gpu_server.grpc_url
    client = mod.InferenceServerClient(url)
    data = np.arange(1, 1 + (1 << 15), dtype=np.float32)  # 128 KiB: through a shared arena
    try:
        tensor = mod.InferInput("INPUT0", [data.size], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor])
        assert np.array_equal(result.as_numpy("OUTPUT0"), data * 2)
        assert bool(result.as_numpy("ON_GPU")[0]) is False
    finally:
        client.close()


def test_regions_made_by_tritonclients_cuda_shared_memory_utilities(gpu_server):
    """The flow of Triton's simple_grpc_cudashm_client example, with the client library's own
    helpers (they need the cuda-python package)."""
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except RuntimeError as exc:  # the library's way of saying cuda-python is missing
        pytest.skip(str(exc))
    client = grpcclient.InferenceServerClient(gpu_server.grpc_url)
    data = np.arange(16, dtype=np.float32)
    region_in = cudashm.create_shared_memory_region("input_data", data.nbytes, 0)
    region_out = cudashm.create_shared_memory_region("output_data", data.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(region_in, [data])
        client.register_cuda_shared_memory("input_data", cudashm.get_raw_handle(region_in), 0,
                                           data.nbytes)
        client.register_cuda_shared_memory("output_data", cudashm.get_raw_handle(region_out),
                                           0, data.nbytes)
        tensor = grpcclient.InferInput("INPUT0", [16], "FP32")
        tensor.set_shared_memory("input_data", data.nbytes)
        requested = grpcclient.InferRequestedOutput("OUTPUT0")
        requested.set_shared_memory("output_data", data.nbytes)
        result = client.infer("double_gpu", [tensor], outputs=[requested])
        output = result.get_output("OUTPUT0")
        # Metadata alone, as Triton answers for an output in shared memory.
        assert output.shape == [16] and output.datatype == "FP32"
        assert not result.get_response().raw_output_contents[0]
        got = cudashm.get_contents_as_numpy(region_out, np.float32, [16])
        assert np.array_equal(got, data * 2)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(region_in)
        cudashm.destroy_shared_memory_region(region_out)
        client.close()


def test_a_region_larger_than_its_allocation_is_refused(gpu_server):
    client = grpcclient.InferenceServerClient(gpu_server.grpc_url)
    data = cupy.zeros(4, dtype=cupy.float32)
    try:
        client.register_cuda_shared_memory("in", _handle(data), 0, 1 << 20)
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_shared_memory("in", 16)
        with pytest.raises(Exception, match="exceeds"):
            client.infer("double_gpu", [tensor])
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
