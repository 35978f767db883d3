"""Benchmark shmserve's native ONNX Runtime backend (workers/backends/onnxruntime.py) against
the in-process limit (onnxruntime alone, in one process, in a loop) and against the real Triton
2.51 running the same .onnx files through onnxruntime inside a Python-backend model.py (what a
Triton user without an ONNX backend does), in one run; and the memory of shmserve's ONNX worker
against a plain process holding the same session.

    .venv/bin/python perf/bench_backends.py                    # ~4-6 min
    .venv/bin/python perf/bench_backends.py --quick            # short windows, a smoke test, ~1 min
    .venv/bin/python perf/bench_backends.py --only shmserve     # no Triton (and no Triton ratios)
    .venv/bin/python perf/bench_backends.py --protocols grpc --threads 1

Models, built by this script with onnx.helper (random weights from a fixed seed; nothing is
downloaded), written with their configs into two repositories under the run's results folder:

- `tiny`: OUTPUT0 = INPUT0 + INPUT1, FP32 [N, 16], max_batch_size 8, dynamic batching without
  delay; measured at concurrency 1 (latency) and 8;
- `heavy`: INPUT0 FP32 [N, 512] through `--heavy-blocks` (6) blocks of MatMul+Add+Relu
  512 -> 2048 -> 512, max_batch_size 8, dynamic batching with max_queue_delay_microseconds
  `--heavy-delay-us` (2000); measured at concurrency 8 (throughput) and 1.

Each config has one CPU instance and an explicit `intra_op_thread_count` parameter, `--threads`
(default: the cores this process may run on, which is what shmserve's backend would pick for one
instance without it); the in-process loop and Triton's model.py use the same number. The script
checks that shmserve's backend builds the same session options from the config as the in-process
loop does (threads, graph optimization level, execution mode, memory arena and pattern).

What it runs, one thing at a time, never two servers together:

1. the in-process limit: perf/ort_inprocess.py, a child process that imports only numpy and
   onnxruntime, times session.run at every batch size from 1 to 8, one call at a time (in rounds
   over the sizes), and then reports its own memory. In-process infer/s at batch size B = B / the
   median time of a run of B;
2. then each server in turn (Triton, then shmserve), started, checked, measured and stopped by its
   PID: outputs checked against onnxruntime run here (perf_analyzer never looks at outputs);
   perf_analyzer for each model, protocol and concurrency (a case that does not settle is taken
   once more with twice the stability tolerance, and marked); then the memory of the `tiny`
   model's process (shmserve's worker: the server's child holding that instance's shared memory;
   Triton's python-backend stub). shmserve runs with its normal flags (ShmServer) and serves the
   native ONNX models; the anchors' Triton 2.51 serves the python-backend wrappers, and this
   script holds /tmp/anchor-triton.lock (fcntl.flock) from before it starts until it stopped, as
   other sessions share the anchors' Triton.

Triton's Python stubs run the anchors' venv, which has no onnxruntime until it is installed once
(keeping numpy < 2, which the stubs need; check with --dry-run that pip changes no numpy):

    ~/shmserve-anchors/triton-venv/bin/pip install --dry-run onnxruntime "numpy<2"
    ~/shmserve-anchors/triton-venv/bin/pip install -c ~/shmserve-anchors/constraints-triton.txt \\
        onnxruntime "numpy<2"

Without it the script measures shmserve only and reports the missing package as an error. The
report names both onnxruntime versions; compare only runs where they agree.

Prints markdown tables (the targets first) and writes everything under
perf/results/backends-<date>-<time>/ (the .onnx files are deleted at the end unless
--keep-models; configs and model.py stay).

The script is this command line; the models, the measurements and the report are the package
backend_bench/ beside it.
"""
import sys

from backend_bench.runner import main

if __name__ == "__main__":
    sys.exit(main(__doc__))
