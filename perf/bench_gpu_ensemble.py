"""What an ensemble's intermediate tensor costs between two GPU steps on shmserve: kept on the
GPU (the second step reads the first one's output in place), against one trip through host
memory (the second step's model takes host inputs, as the Python backend's default, so the
tensor is copied to the host and back: what every intermediate cost before they stayed on the
GPU), and one step alone for the floor.

    python perf/bench_gpu_ensemble.py [--sizes-mib 4 64] [--seconds 3] [--out results.json]

The client's tensors are in CUDA shared memory both ways, so the intermediate is the only
tensor that moves. Needs a GPU, cupy and tritonclient (a lent GPU machine: perf/README.md);
reports shmserve alone, as the real Triton is not installed there. One gRPC client, one request
at a time.
"""
import base64
import sys
from pathlib import Path

import cupy
import numpy as np
import tritonclient.grpc as grpcclient

from bench_cuda_shm import CONFIG, GPU_INPUTS, TIMES, arguments, measure_all, report

MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        import cupy
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            data = cupy.asarray(tensor.as_numpy()) if tensor.is_cpu() else cupy.from_dlpack(tensor)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", data * 2)]))
        return responses
'''

ENSEMBLE = '''
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "first" model_version: -1
     input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "MID" }} }},
  {{ model_name: "{second}" model_version: -1
     input_map {{ key: "INPUT0" value: "MID" }} output_map {{ key: "OUTPUT0" value: "OUT" }} }}
] }}
'''

# mode -> (model the client calls, input/output names, times the input is doubled)
MODES = {
    "one step alone": ("first", ("INPUT0", "OUTPUT0"), 2),
    "two steps, intermediate on the GPU": ("on_gpu", ("IN", "OUT"), 4),
    "two steps, intermediate through the host": ("via_host", ("IN", "OUT"), 4),
}


def write_repository(root: Path) -> None:
    for name, parameters in (("first", GPU_INPUTS), ("second_gpu_inputs", GPU_INPUTS),
                             ("second_host_inputs", "")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, parameters=parameters))
        (root / name / "1" / "model.py").write_text(MODEL)
    for name, second in (("on_gpu", "second_gpu_inputs"), ("via_host", "second_host_inputs")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name, second=second))


class Case:
    """One mode at one size: the client's input and output in CUDA shared memory."""

    def __init__(self, client, mode: str, nbytes: int):
        self.client, self.mode, self.nbytes = client, mode, nbytes
        self.model, (input_name, output_name), self.factor = MODES[mode]
        self.expected = np.arange(nbytes // 4, dtype=np.float32)
        self.data = cupy.asarray(self.expected)
        self.out = cupy.zeros_like(self.data)
        for name, array in (("in", self.data), ("out", self.out)):
            handle = base64.b64encode(cupy.cuda.runtime.ipcGetMemHandle(array.data.ptr))
            client.register_cuda_shared_memory(name, handle, 0, nbytes)
        self.tensor = grpcclient.InferInput(input_name, [nbytes // 4], "FP32")
        self.tensor.set_shared_memory("in", nbytes)
        self.outputs = [grpcclient.InferRequestedOutput(output_name)]
        self.outputs[0].set_shared_memory("out", nbytes)

    def infer(self) -> None:
        self.client.infer(self.model, [self.tensor], outputs=self.outputs)

    def check(self) -> None:
        self.out.fill(0)
        self.infer()
        if not np.array_equal(cupy.asnumpy(self.out), self.expected * self.factor):
            raise AssertionError(f"{self.mode}, {self.nbytes >> 20} MiB: wrong output")

    def close(self) -> None:
        self.client.unregister_cuda_shared_memory()


def main() -> int:
    args = arguments(__doc__)
    report(measure_all(write_repository, Case, MODES, args), args, TIMES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
