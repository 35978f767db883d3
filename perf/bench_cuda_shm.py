"""Large tensors to a GPU model on shmserve, by each way a client can send them: in CUDA shared
memory (the model reads the client's device buffer in place, and its output is copied device to
device into the client's output buffer), in CUDA shared memory with the Python backend's
default of host inputs, in system shared memory, and inside the gRPC messages.

    python perf/bench_cuda_shm.py [--sizes-mib 4 64] [--seconds 3] [--out results.json]

Needs a GPU, cupy and tritonclient (run it on a lent GPU machine: perf/README.md). The real
Triton is not installed on those machines, so this reports shmserve alone, next to the copy
floors the GPU itself sets (cupy device-to-device and host-to-device copies of the same size).
One gRPC client, one request at a time: the time each way adds to a request.
"""
import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

import cupy

from servers import ShmServer, free_port

MIB = 1 << 20

MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0"))]) for r in requests]
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_GPU }} ]
{parameters}
'''

GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'
# mode -> (model, where the client's tensors are)
MODES = {
    "cuda": ("identity_gpu", "cuda"),
    "cuda, host inputs": ("identity_gpu_host_inputs", "cuda"),
    "system shm": ("identity_gpu_host_inputs", "system"),
    "in the messages": ("identity_gpu_host_inputs", "plain"),
}


def write_repository(root: Path) -> None:
    for name, parameters in (("identity_gpu", GPU_INPUTS), ("identity_gpu_host_inputs", "")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, parameters=parameters))
        (root / name / "1" / "model.py").write_text(MODEL)


def copy_floor_ms(nbytes: int) -> dict:
    """Best of ten cupy copies of nbytes: device to device and host to device."""
    src = cupy.zeros(nbytes, cupy.uint8)
    dst = cupy.empty_like(src)
    host = np.ones(nbytes, np.uint8)
    floors = {}
    for name, copy in (("device to device", lambda: cupy.copyto(dst, src)),
                       ("host to device", lambda: dst.set(host))):
        times = []
        for _ in range(10):
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            copy()
            cupy.cuda.runtime.deviceSynchronize()
            times.append(time.perf_counter() - t0)
        floors[name] = min(times) * 1e3
    return floors


class Case:
    """One mode at one size: the client's buffers, registered as the mode needs, and one infer."""

    def __init__(self, client, mode: str, nbytes: int):
        self.client, self.mode, self.nbytes = client, mode, nbytes
        self.model, self.where = MODES[mode]
        elements = nbytes // 4
        self.expected = np.arange(elements, dtype=np.float32)
        self.tensor = grpcclient.InferInput("INPUT0", [elements], "FP32")
        self.outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
        self.system = []
        if self.where == "cuda":
            self.data = cupy.asarray(self.expected)
            self.out = cupy.zeros_like(self.data)
            for name, array in (("in", self.data), ("out", self.out)):
                handle = base64.b64encode(cupy.cuda.runtime.ipcGetMemHandle(array.data.ptr))
                client.register_cuda_shared_memory(name, handle, 0, nbytes)
        elif self.where == "system":
            for name in ("in", "out"):
                key = f"/bench_cuda_shm_{os.getpid()}_{name}"
                region = shm.create_shared_memory_region(name, key, nbytes)
                self.system.append(region)
                client.register_system_shared_memory(name, key, nbytes)
            shm.set_shared_memory_region(self.system[0], [self.expected])
        if self.where == "plain":
            self.tensor.set_data_from_numpy(self.expected)
        else:
            self.tensor.set_shared_memory("in", nbytes)
            self.outputs[0].set_shared_memory("out", nbytes)

    def infer(self) -> None:
        self.client.infer(self.model, [self.tensor], outputs=self.outputs)

    def check(self) -> None:
        self.infer()
        if self.where == "cuda":
            got = cupy.asnumpy(self.out)
        elif self.where == "system":
            got = shm.get_contents_as_numpy(self.system[1], np.float32, [self.nbytes // 4])
        else:
            got = self.client.infer(self.model, [self.tensor]).as_numpy("OUTPUT0")
        if not np.array_equal(got, self.expected):
            raise AssertionError(f"{self.mode}, {self.nbytes >> 20} MiB: wrong output")

    def close(self) -> None:
        if self.where == "cuda":
            self.client.unregister_cuda_shared_memory()
        elif self.where == "system":
            self.client.unregister_system_shared_memory()
            for region in self.system:
                shm.destroy_shared_memory_region(region)


def measure(case: Case, seconds: float) -> dict:
    case.check()
    for _ in range(3):
        case.infer()
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end or len(times) < 10:
        t0 = time.perf_counter()
        case.infer()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"requests": len(times), "p50_ms": statistics.median(times) * 1e3,
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
            "infer_per_s": len(times) / sum(times)}


def arguments(doc: str):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[4, 64])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", type=Path)
    return ap.parse_args()


def measure_all(write_repository, make_case, modes, args, extra=lambda nbytes: {}) -> dict:
    """Serve the repository `write_repository(root)` writes, and measure `make_case(client,
    mode, nbytes)` for each of `modes` at each size; `extra(nbytes)` adds figures of a size."""
    cupy.cuda.set_allocator(None)  # whole allocations: an IPC handle names one
    results = {"gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_repository(repo)
        server = ShmServer(repo, (free_port(), free_port(), free_port()), Path(tmp) / "log")
        server.start()
        try:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            for mib in args.sizes_mib:
                figures = extra(mib * MIB)
                for mode in modes:
                    case = make_case(client, mode, mib * MIB)
                    try:
                        results["cases"].append({"mode": mode, "mib": mib, **figures,
                                                 **measure(case, args.seconds)})
                    finally:
                        case.close()
            client.close()
        finally:
            leftovers = server.stop()
            if leftovers:
                print(f"shmserve left processes behind: {leftovers}", file=sys.stderr)
    return results


def report(results: dict, args, columns: list) -> None:
    """Print the cases as a table of `columns` ((title, key), after size and mode), and write
    them to --out."""
    lines = [f"shmserve on {results['gpu']}, one gRPC client, one request at a time\n",
             "| MiB | mode | " + " | ".join(title for title, _ in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for c in results["cases"]:
        lines.append(f"| {c['mib']} | {c['mode']} | "
                     + " | ".join(f"{c[key]:.3f}" for _, key in columns) + " |")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


TIMES = [("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("infer/s", "infer_per_s")]


def main() -> int:
    args = arguments(__doc__)
    results = measure_all(write_repository, Case, MODES, args, extra=copy_floor_ms)
    report(results, args, TIMES + [("D2D copy ms", "device to device"),
                                   ("H2D copy ms", "host to device")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
