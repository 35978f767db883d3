"""The in-process limit of an ONNX model: onnxruntime alone, in this one process, in a loop.
bench_backends.py runs it as a child process and reads the JSON it prints on stdout.

    python perf/ort_inprocess.py MODEL.onnx --threads N --input NAME:COLS [--input ...]
                                 --batches 1 2 4 8 --seconds S [--min-runs N] [--rounds R]

For each batch size, session.run of a batch of that size (FP32 inputs [batch, COLS], random,
made once) is timed one call at a time over S seconds (at least --min-runs calls), after a few
warm-up calls; the JSON gives per batch size the calls' median, mean and 99th percentile in µs.
The time goes in R rounds over all batch sizes, so that a disturbance from elsewhere (other
work on the machine) spreads over the sizes instead of bending the curve at a few.
Then this process's memory (VmRSS and its parts, KiB), as a plain process holding the session
after those runs: the figure a model's worker is compared with.

It imports numpy and onnxruntime only, so that its memory is that of a plain process. The
session options are built here as shmserve's onnxruntime backend builds them from a config
with only `intra_op_thread_count` set (bench_backends.py checks that they agree).
"""
import argparse
import json
import time

import numpy as np
import onnxruntime as ort

WARMUP_RUNS = 5


def session(path: str, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def options_summary(options: ort.SessionOptions) -> dict:
    """The settings that decide how a session runs, comparable between processes."""
    return dict(intra_op_num_threads=options.intra_op_num_threads,
                inter_op_num_threads=options.inter_op_num_threads,
                graph_optimization_level=str(options.graph_optimization_level),
                execution_mode=str(options.execution_mode),
                enable_cpu_mem_arena=options.enable_cpu_mem_arena,
                enable_mem_pattern=options.enable_mem_pattern)


def time_runs(sess: ort.InferenceSession, feeds: dict, seconds: float, min_runs: int, times_ns: list) -> None:
    """Appends to times_ns the durations of session.run calls over `seconds` (at least min_runs)."""
    clock = time.perf_counter_ns
    deadline, start = clock() + int(seconds * 1e9), len(times_ns)
    while len(times_ns) - start < min_runs or clock() < deadline:
        t0 = clock()
        sess.run(None, feeds)
        times_ns.append(clock() - t0)


def summary(times_ns: list) -> dict:
    us = np.array(times_ns, dtype=np.float64) / 1e3
    return dict(runs=len(times_ns), p50_us=float(np.percentile(us, 50)), mean_us=float(us.mean()),
                p99_us=float(np.percentile(us, 99)))


def memory_kib() -> dict:
    """VmRSS and its anonymous, file-backed and shared-memory parts, KiB."""
    keys = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in keys:
                found[key] = int(line.split()[1])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, required=True, help="intra_op_num_threads")
    ap.add_argument("--input", action="append", required=True, metavar="NAME:COLS",
                    help="an FP32 input of shape [batch, COLS]")
    ap.add_argument("--batches", type=int, nargs="+", required=True)
    ap.add_argument("--seconds", type=float, required=True, help="timed seconds per batch size")
    ap.add_argument("--min-runs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=4, help="rounds over the batch sizes (default 4)")
    args = ap.parse_args()

    sess = session(args.model, args.threads)
    rng = np.random.default_rng(0)
    inputs = [(name, int(cols)) for name, cols in (spec.split(":") for spec in args.input)]
    feeds = {batch: {name: rng.standard_normal((batch, cols), dtype=np.float32) for name, cols in inputs}
             for batch in args.batches}
    for batch in args.batches:
        for _ in range(WARMUP_RUNS):
            sess.run(None, feeds[batch])
    times = {batch: [] for batch in args.batches}
    rounds = max(args.rounds, 1)
    for _ in range(rounds):
        for batch in args.batches:
            time_runs(sess, feeds[batch], args.seconds / rounds, -(-args.min_runs // rounds), times[batch])
    batches = {str(batch): summary(times[batch]) for batch in args.batches}
    print(json.dumps(dict(ort_version=ort.__version__, options=options_summary(sess.get_session_options()),
                          rounds=rounds, batches=batches, memory_kib=memory_kib())))


if __name__ == "__main__":
    main()
