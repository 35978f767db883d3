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
"""
import argparse
import bisect
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from pa_runner import measure_server
from servers import (PERF_DIR, REPO_ROOT, SERVER_NAMES, Server, ServerError, ShmServer, TritonServer,
                     add_server_arguments, add_steal_arguments, fmt, interpreters_line, markdown_row,
                     measure_steady, new_run, process_tree, publish, ratio, run_metadata, run_servers,
                     serve_and_measure)

MAX_BATCH = 8
TINY_COLS = 16
HEAVY_WIDTH, HEAVY_HIDDEN = 512, 2048
OPSET, IR_VERSION = 17, 8  # old enough for any onnxruntime either venv may hold
SEED = 20261129
PROTOCOLS = {"grpc": grpcclient, "http": httpclient}
TRITON_LOCK = Path("/tmp/anchor-triton.lock")
INPROCESS = PERF_DIR / "ort_inprocess.py"
MB = 1e6

# The issue's targets.
TARGET_LIMIT_RATIO = 0.9      # heavy, concurrency 8: shmserve infer/s / in-process at its batch size
TARGET_ADDED_P50_US = 150     # tiny, concurrency 1: shmserve p50 - in-process p50 of one batch-1 run
TARGET_TINY_VS_TRITON = 1.5   # tiny: shmserve infer/s / Triton's
TARGET_HEAVY_VS_TRITON = 1.0  # heavy: the same
TARGET_P99_VS_TRITON = 1.0    # both: p99 no worse than Triton's
TARGET_RSS_MB = 40            # tiny's worker VmRSS - the plain process's, MB


# --- models and repositories -------------------------------------------------------------------


def _save(graph, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build_tiny(path: Path) -> None:
    def fp32(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", TINY_COLS])

    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "tiny",
                              [fp32("INPUT0"), fp32("INPUT1")], [fp32("OUTPUT0")])
    _save(graph, path)


def build_heavy(path: Path, blocks: int) -> None:
    """blocks x (MatMul+Add+Relu 512 -> 2048, MatMul+Add(+Relu) 2048 -> 512); weights scaled by
    1/sqrt(fan-in) so that activations stay of order 1 through the stack."""
    rng = np.random.default_rng(SEED)
    nodes, weights, x = [], [], "INPUT0"
    layers = [(HEAVY_WIDTH, HEAVY_HIDDEN), (HEAVY_HIDDEN, HEAVY_WIDTH)] * blocks
    for i, (fan_in, fan_out) in enumerate(layers):
        w = (rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.01 * rng.standard_normal(fan_out, dtype=np.float32)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], ["OUTPUT0" if last else f"add{i}"])]
        if not last:
            nodes.append(helper.make_node("Relu", [f"add{i}"], [f"relu{i}"]))
            x = f"relu{i}"

    def fp32(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", HEAVY_WIDTH])

    _save(helper.make_graph(nodes, "heavy", [fp32("INPUT0")], [fp32("OUTPUT0")], weights), path)


class Model:
    """A benchmark model: its name, FP32 inputs (name, columns), output, dynamic-batching delay
    and the concurrencies it is measured at."""

    def __init__(self, name: str, inputs: list[tuple[str, int]], output_cols: int, delay_us: int,
                 concurrency: list[int]):
        self.name, self.inputs, self.output_cols = name, inputs, output_cols
        self.delay_us, self.concurrency = delay_us, concurrency

    def config(self, backend: str, threads: int) -> str:
        inputs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {c} ] }}' for n, c in self.inputs)
        delay = f" max_queue_delay_microseconds: {self.delay_us} " if self.delay_us else " "
        return (f'name: "{self.name}"\nbackend: "{backend}"\nmax_batch_size: {MAX_BATCH}\n'
                f"input [ {inputs} ]\n"
                f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {self.output_cols} ] }} ]\n'
                f"dynamic_batching {{{delay}}}\n"
                "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}\n')


# What a Triton user without an onnxruntime backend writes: the session in a Python-backend
# model, a dynamic batch run as one session.run, each request given its rows.
TRITON_MODEL_PY = '''\
"""onnxruntime inside Triton's Python backend, written by perf/bench_backends.py: the session
options as shmserve's onnxruntime backend builds them from this config."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {key: value.get("string_value", "") for key, value in (config.get("parameters") or {}).items()}
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = int(parameters["intra_op_thread_count"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.inputs = [entry["name"] for entry in config["input"]]
        self.outputs = [entry["name"] for entry in config["output"]]

    def execute(self, requests):
        parts = {name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
                 for name in self.inputs}
        rows = [array.shape[0] for array in parts[self.inputs[0]]]
        feeds = {name: arrays[0] if len(arrays) == 1 else np.concatenate(arrays) for name, arrays in parts.items()}
        results = self.session.run(self.outputs, feeds)
        responses, start = [], 0
        for n in rows:
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, result[start:start + n]) for name, result in zip(self.outputs, results)]))
            start += n
        return responses
'''


def write_repositories(out_dir: Path, models: list[Model], args) -> tuple[Path, Path, dict[str, Path]]:
    """(shmserve's repository, Triton's, model name -> its .onnx). Both repositories hold the
    same .onnx files (hard links where the file system allows)."""
    onnx_dir, shm_repo, triton_repo = out_dir / "models", out_dir / "repo_shmserve", out_dir / "repo_triton"
    onnx_dir.mkdir()
    files = {}
    for model in models:
        path = onnx_dir / f"{model.name}.onnx"
        build_tiny(path) if model.name == "tiny" else build_heavy(path, args.heavy_blocks)
        files[model.name] = path
        for repo, backend in ((shm_repo, "onnxruntime"), (triton_repo, "python")):
            version = repo / model.name / "1"
            version.mkdir(parents=True)
            (repo / model.name / "config.pbtxt").write_text(model.config(backend, args.threads))
            try:
                os.link(path, version / "model.onnx")
            except OSError:
                (version / "model.onnx").write_bytes(path.read_bytes())
        (triton_repo / model.name / "1" / "model.py").write_text(TRITON_MODEL_PY)
    return shm_repo, triton_repo, files


def remove_model_files(out_dir: Path) -> None:
    for path in out_dir.glob("**/*.onnx"):
        path.unlink()
    try:
        (out_dir / "models").rmdir()
    except OSError:
        pass


# --- the in-process limit ----------------------------------------------------------------------


def run_inprocess(model: Model, path: Path, args) -> dict:
    """ort_inprocess.py on one model, with shmserve's interpreter (the worker's onnxruntime)."""
    cmd = [ShmServer.python(), str(INPROCESS), str(path), "--threads", str(args.threads),
           "--batches", *map(str, range(1, MAX_BATCH + 1)), "--seconds", str(args.inprocess_s),
           "--min-runs", str(args.tiny_min_runs if model.name == "tiny" else 20)]
    for name, cols in model.inputs:
        cmd += ["--input", f"{name}:{cols}"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        return dict(error=f"ort_inprocess.py exited with {p.returncode}: {p.stderr.strip()[-600:]}")
    return dict(json.loads(p.stdout), error=None)


def limit_at(inproc: dict, batch: float | None) -> float | None:
    """In-process infer/s at a (fractional, average) batch size: batch / median time of one run,
    the time interpolated linearly between the two measured batch sizes around it."""
    if not inproc or batch is None or inproc.get("error"):
        return None
    sizes = sorted(int(b) for b in inproc["batches"])
    batch = min(max(batch, sizes[0]), sizes[-1])
    i = bisect.bisect_left(sizes, batch)
    hi = sizes[i]
    lo = sizes[i - 1] if i > 0 and sizes[i] != batch else hi
    t_lo, t_hi = (inproc["batches"][str(b)]["p50_us"] for b in (lo, hi))
    t = t_hi if hi == lo else t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo)
    return batch / (t / 1e6)


def backend_options(config: dict) -> dict:
    """The session options shmserve's onnxruntime backend builds from a model's config (as the
    server completed and serves it), in ort_inprocess.options_summary's form."""
    sys.path.insert(0, str(REPO_ROOT))  # this checkout's backend, not an installed one
    sys.path.insert(0, str(PERF_DIR))
    from ort_inprocess import options_summary
    from workers.backends import onnxruntime as backend
    if not Path(backend.__file__).resolve().is_relative_to(REPO_ROOT):
        raise ServerError(f"imported {backend.__file__}, not this checkout's backend")
    return options_summary(backend.session_options(config)[0])


# --- checks and measurements -------------------------------------------------------------------


def port_of(server: Server, protocol: str) -> int:
    return server.grpc_port if protocol == "grpc" else server.http_port


def model_config(server: Server, model: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/config", timeout=10) as r:
        return json.loads(r.read())


def check_outputs(server: Server, model: Model, session, protocols: list[str]) -> None:
    """A batch of 3 random rows per protocol: OUTPUT0 must be what onnxruntime here computes."""
    rng = np.random.default_rng()
    data = {name: rng.standard_normal((3, cols), dtype=np.float32) for name, cols in model.inputs}
    expected = session.run(["OUTPUT0"], data)[0]
    for protocol in protocols:
        module = PROTOCOLS[protocol]
        client = module.InferenceServerClient(f"127.0.0.1:{port_of(server, protocol)}")
        try:
            tensors = []
            for name, array in data.items():
                tensors.append(module.InferInput(name, list(array.shape), "FP32"))
                tensors[-1].set_data_from_numpy(array)
            out = client.infer(model.name, tensors).as_numpy("OUTPUT0")
        except InferenceServerException as e:
            raise ServerError(f"{server.name} {model.name} {protocol}: infer failed: {e}") from e
        finally:
            client.close()
        if out is None or out.shape != expected.shape or not np.allclose(out, expected, rtol=1e-4, atol=1e-5):
            raise ServerError(f"{server.name} {model.name} {protocol}: OUTPUT0 (shape "
                              f"{None if out is None else out.shape}) differs from onnxruntime's")


def memory_kib(pid: int) -> dict:
    keys = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in keys:
                found[key] = int(line.split()[1])
    return found


_ARENA = re.compile(r"^shmserve\.\d+\.(?P<instance>.+)\.[a-z]+\.\d+$")


def shmserve_worker(server_pid: int, model: str) -> int | None:
    """The worker of the model's first instance: the server's descendant holding that instance's
    shared memory (/dev/shm/shmserve.<front pid>.<model>_<group>_<n>.<kind>.<n>) open."""
    for pid in process_tree(server_pid)[1:]:
        try:
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for target in targets:
            m = _ARENA.match(os.path.basename(target)) if target.startswith("/dev/shm/") else None
            if m and m.group("instance").rsplit("_", 2)[0] == model:
                return pid
    return None


def triton_stub(server_pid: int, model: str, repository: Path) -> int | None:
    """The python-backend stub of the model: the descendant whose command line names its folder."""
    folder = str(repository / model)
    for pid in process_tree(server_pid)[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(arg.rstrip("/") == folder or arg.startswith(folder + "/") for arg in argv):
            return pid
    return None


def measure_one(server: Server, model: Model, protocol: str, concurrency: int, pa, out_dir: Path, args) -> dict:
    """One perf_analyzer case. One that does not settle within --stability is taken once more
    with twice the tolerance (`retried_with_s` in its record, marked in the report), so that a
    busy machine leaves a figure, flagged, rather than an empty target."""
    pa_args = ["-m", model.name, "-u", f"127.0.0.1:{port_of(server, protocol)}", "-i", protocol,
               "--concurrency-range", f"{concurrency}:{concurrency}"]
    stem = out_dir / "pa" / f"{server.name}_{model.name}_{protocol}_c{concurrency}"

    def run() -> dict:
        rec = measure_server(server.pid, pa, pa_args, stem, args.measurement_args, retry=False)
        if rec["error"] and "stable" in rec["error"].lower() and args.stability < 100:
            looser = min(2 * args.stability, 100)
            rec = dict(measure_server(server.pid, pa, pa_args, stem.with_name(f"{stem.name}_s{looser}"),
                                      measurement_args(args, looser), retry=False), retried_with_s=looser)
        return rec

    return measure_steady(run, args.max_steal, args.steal_reruns)


def check_and_measure(server: Server, models: list[Model], pa, out_dir: Path, args, sessions: dict,
                      records: list[dict], errors: list[str]) -> None:
    usable = []
    for model in models:
        try:
            server.wait_model_ready(model.name, timeout_s=120)
            check_outputs(server, model, sessions[model.name], args.protocols)
            usable.append(model)
            if server.name == "shmserve":
                got, want = backend_options(model_config(server, model.name)), args.inprocess_options
                records.append(dict(kind="options", model=model.name, backend=got, inprocess=want,
                                    error=None if got == want else "differ"))
                if got != want:
                    errors.append(f"shmserve {model.name}: the backend's session options {got} are not "
                                  f"the in-process loop's {want}")
        except (ServerError, OSError) as e:
            errors.append(f"{e} -> {model.name} not measured on {server.name}")
    for model in usable:
        for protocol in args.protocols:
            for concurrency in model.concurrency:
                figures = measure_one(server, model, protocol, concurrency, pa, out_dir, args)
                rec = dict(kind="perf_analyzer", server=server.name, model=model.name, protocol=protocol,
                           concurrency=concurrency, **figures)
                records.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
    if any(m.name == "tiny" for m in usable):
        if server.name == "shmserve":
            pid, what = shmserve_worker(server.pid, "tiny"), "shmserve worker"
        else:
            pid, what = triton_stub(server.pid, "tiny", server.model_repository), "Triton python-backend stub"
        if pid is None:
            errors.append(f"{server.name}: no process of model tiny found among the server's children")
        else:
            records.append(dict(kind="memory", server=server.name, model="tiny", process=what, pid=pid,
                                memory_kib=memory_kib(pid), error=None))
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)


@contextmanager
def anchor_triton_lock():
    """The anchors' Triton is shared with other sessions: hold the lock they take for as long as
    this run's Triton lives."""
    with open(TRITON_LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {TRITON_LOCK} (another session uses the anchors' Triton)",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def triton_onnxruntime(env: dict[str, str]) -> tuple[str | None, str]:
    """(onnxruntime's version in the anchors' Triton venv or None, what its python said)."""
    python = Path(env["TRITON_VENV"]) / "bin" / "python"
    code = "import numpy, onnxruntime; print(onnxruntime.__version__, numpy.__version__)"
    p = subprocess.run([str(python), "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else f"exit {p.returncode}"
    ort_version, numpy_version = p.stdout.split()
    return ort_version, f"onnxruntime {ort_version}, numpy {numpy_version}"


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("pass" if ok else "FAIL")


class Results:
    """The records of a run, looked up by what the report asks."""

    def __init__(self, records: list[dict]):
        self.pa = {(r["server"], r["model"], r["protocol"], r["concurrency"]): r
                   for r in records if r["kind"] == "perf_analyzer" and r["error"] is None}
        self.inproc = {r["model"]: r for r in records if r["kind"] == "inprocess" and r["error"] is None}
        self.memory = {r["server"]: r for r in records if r["kind"] == "memory"}
        self.options = [r for r in records if r["kind"] == "options"]

    def get(self, server: str, model: str, protocol: str, concurrency: int, key: str):
        return self.pa.get((server, model, protocol, concurrency), {}).get(key)

    def inproc_p50_us(self, model: str, batch: int):
        return self.inproc.get(model, {}).get("batches", {}).get(str(batch), {}).get("p50_us")

    def rss_kib(self, server: str | None):
        """VmRSS of the tiny model's process: the server's, or the plain process's for None."""
        rec = self.memory.get(server) if server else self.inproc.get("tiny")
        return (rec or {}).get("memory_kib", {}).get("VmRSS")


def target_rows(res: Results, models: list[Model], protocols: list[str]) -> list[tuple[str, str, str, str]]:
    """(target, measured, goal, verdict) for each of the issue's targets."""
    rows = []
    for protocol in protocols:
        s_ips, batch = (res.get("shmserve", "heavy", protocol, 8, key) for key in ("infer_per_s", "avg_batch"))
        limit = limit_at(res.inproc.get("heavy"), batch)
        r = ratio(s_ips, limit)
        rows.append((f"heavy, {protocol}, conc 8: shmserve infer/s / in-process at its batch ({fmt(batch, '.1f')})",
                     f"{fmt(s_ips, ',.0f')} / {fmt(limit, ',.0f')} = {fmt(r, '.2f')}", f">= {TARGET_LIMIT_RATIO}",
                     verdict(None if r is None else r >= TARGET_LIMIT_RATIO)))
        s_p50 = res.get("shmserve", "tiny", protocol, 1, "p50_ms")
        s_p50 = None if s_p50 is None else s_p50 * 1e3
        base = res.inproc_p50_us("tiny", 1)
        added = None if s_p50 is None or base is None else s_p50 - base
        rows.append((f"tiny, {protocol}, conc 1: shmserve p50 - in-process p50 (batch 1)",
                     f"{fmt(s_p50, ',.0f')} - {fmt(base, ',.0f')} = {fmt(added, ',.0f')} µs",
                     f"<= {TARGET_ADDED_P50_US} µs", verdict(None if added is None else added <= TARGET_ADDED_P50_US)))
        goals = {"tiny": TARGET_TINY_VS_TRITON, "heavy": TARGET_HEAVY_VS_TRITON}
        for model, c in ((m.name, c) for m in models for c in m.concurrency):
            r_ips, r_p99 = (ratio(res.get("shmserve", model, protocol, c, key),
                                  res.get("triton", model, protocol, c, key)) for key in ("infer_per_s", "p99_ms"))
            rows.append((f"{model}, {protocol}, conc {c}: shmserve / Triton infer/s", fmt(r_ips, ".2f"),
                         f">= {goals[model]}", verdict(None if r_ips is None else r_ips >= goals[model])))
            rows.append((f"{model}, {protocol}, conc {c}: shmserve / Triton p99", fmt(r_p99, ".2f"),
                         f"<= {TARGET_P99_VS_TRITON}",
                         verdict(None if r_p99 is None else r_p99 <= TARGET_P99_VS_TRITON)))
    worker, plain = res.rss_kib("shmserve"), res.rss_kib(None)

    def mb(kib):
        return None if kib is None else kib * 1024 / MB

    delta = None if worker is None or plain is None else mb(worker - plain)
    rows.append(("tiny: shmserve worker VmRSS - plain process VmRSS",
                 f"{fmt(mb(worker), '.1f')} - {fmt(mb(plain), '.1f')} = {fmt(delta, '.1f')} MB",
                 f"<= {TARGET_RSS_MB} MB", verdict(None if delta is None else delta <= TARGET_RSS_MB)))
    if res.options:
        rows.append(("session options: shmserve's backend (from the served config) = the in-process loop's",
                     ", ".join(r["model"] for r in res.options), "equal",
                     verdict(all(r["error"] is None for r in res.options))))
    return rows


def perf_analyzer_table(res: Results, models: list[Model], protocols: list[str]) -> list[str]:
    lines = [markdown_row(["model", "protocol", "conc", "infer/s", "in-process at that batch", "of limit", "p50 ms",
                           "p99 ms", "avg batch", "server request µs", "queue µs", "compute infer µs",
                           "server CPU cores", "host steal cores"]),
             markdown_row(["---", "---", "---:"] + ["---:"] * 11)]
    for model in models:
        for protocol in protocols:
            for c in model.concurrency:
                t, s = (res.pa.get((server, model.name, protocol, c), {}) for server in SERVER_NAMES)
                inproc = res.inproc.get(model.name)

                def limit(d, inproc=inproc):
                    return limit_at(inproc, d.get("avg_batch"))

                def pair(figure, spec: str, t=t, s=s) -> str:
                    return f"{fmt(figure(t), spec)} / {fmt(figure(s), spec)}"

                def stat(key: str):
                    return lambda d: (d.get("server_stats") or {}).get(key)

                retried = "".join(f" ({name[0].upper()}: -s {rec['retried_with_s']})"
                                  for name, rec in zip(SERVER_NAMES, (t, s)) if rec.get("retried_with_s"))
                lines.append(markdown_row([
                    model.name, protocol, f"{c}{retried}", pair(lambda d: d.get("infer_per_s"), ",.0f"),
                    pair(limit, ",.0f"), pair(lambda d, limit=limit: ratio(d.get("infer_per_s"), limit(d)), ".2f"),
                    pair(lambda d: d.get("p50_ms"), ".3f"), pair(lambda d: d.get("p99_ms"), ".3f"),
                    pair(lambda d: d.get("avg_batch"), ".1f"), pair(stat("request_us"), ",.0f"),
                    pair(stat("queue_us"), ",.0f"), pair(stat("compute_infer_us"), ",.0f"),
                    pair(lambda d: d.get("server_cpu_cores"), ".2f"), pair(lambda d: d.get("steal_cores"), ".2f")]))
    return lines


def inprocess_table(res: Results, models: list[Model]) -> list[str]:
    lines = [markdown_row(["model", "batch", "runs", "p50 µs", "mean µs", "p99 µs", "infer/s (batch / p50)",
                           "host steal cores"]),
             markdown_row(["---"] + ["---:"] * 7)]
    for model in models:
        rec = res.inproc.get(model.name) or {}
        for b, f in rec.get("batches", {}).items():
            lines.append(markdown_row([model.name, b, str(f["runs"]), fmt(f["p50_us"], ",.1f"),
                                       fmt(f["mean_us"], ",.1f"), fmt(f["p99_us"], ",.1f"),
                                       fmt(int(b) / f["p50_us"] * 1e6, ",.0f"), fmt(rec.get("steal_cores"), ".2f")]))
    return lines


def memory_table(res: Results) -> list[str]:
    lines = [markdown_row(["process", "VmRSS", "RssAnon", "RssFile", "RssShmem"]),
             markdown_row(["---"] + ["---:"] * 4)]
    found = [("plain process (numpy + onnxruntime, the same session, after the in-process runs)",
              (res.inproc.get("tiny") or {}).get("memory_kib"))]
    found += [(f"{r['process']} (after its perf_analyzer runs)", r["memory_kib"])
              for r in (res.memory.get("shmserve"), res.memory.get("triton")) if r]
    for label, kib in found:
        if kib:
            lines.append(markdown_row([label] + [fmt(kib.get(k, 0) * 1024 / MB, ".1f")
                                                 for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")]))
    return lines


def report(records: list[dict], models: list[Model], args, versions: dict, elapsed_s: float) -> str:
    res = Results(records)
    rows = target_rows(res, models, args.protocols)
    met = [v for *_, v in rows if v != "–"]
    lines = ["### Targets\n", markdown_row(["target", "measured", "goal", "verdict"]),
             markdown_row(["---", "---:", "---", "---"]), *(markdown_row(row) for row in rows),
             f"\nMet: {met.count('pass')} of {len(met)} measured.\n",
             "### perf_analyzer (each cell: Triton / shmserve)\n",
             *perf_analyzer_table(res, models, args.protocols),
             "\n" + ("(T: -s N), (S: -s N): that server's case did not settle within the set tolerance and "
                     "was taken again with this one. " if any(r.get("retried_with_s") for r in res.pa.values())
                     else "") +
             "In-process at that batch = the in-process limit at the server's average batch (server inference "
             "count / execution count), of limit = infer/s over it (above 1: the in-process runs were slowed by "
             "something else). Server request, queue, compute infer: the server-side averages perf_analyzer "
             "printed. Server CPU: the server's process tree over the perf_analyzer run. Host steal: CPU the "
             f"hypervisor took over the run, in cores (of {os.cpu_count()}); a run above {args.max_steal:g} was "
             f"taken again, up to {args.steal_reruns} times.\n",
             f"### In-process limit: onnxruntime {versions['shmserve']} alone, intra_op_num_threads {args.threads}\n",
             *inprocess_table(res, models),
             "\n### Memory of the process holding the `tiny` model's session (MB)\n",
             *memory_table(res),
             "\nRssShmem of a shmserve worker is the part of its shared-memory arenas it touched (requests' "
             "inputs and outputs), counted in its VmRSS.\n",
             f"Models: tiny (Add, FP32 [N,{TINY_COLS}] x 2), heavy ({args.heavy_blocks} blocks of MatMul+Add+Relu "
             f"{HEAVY_WIDTH} -> {HEAVY_HIDDEN} -> {HEAVY_WIDTH}, FP32 [N,{HEAVY_WIDTH}]); max_batch_size "
             f"{MAX_BATCH}, dynamic batching (heavy: max_queue_delay_microseconds {args.heavy_delay_us}), one CPU "
             f"instance, intra_op_thread_count {args.threads} on both servers and in-process. onnxruntime "
             f"{versions['shmserve']} (shmserve and in-process), {versions['triton'] or '–'} (Triton's stubs). "
             f"perf_analyzer {' '.join(args.measurement_args)}. Run time {elapsed_s / 60:.1f} min."]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="short measurement windows (perf_analyzer -p 500, up to 6 windows, -s 100; 0.2 s in-process per batch size)")
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    ap.add_argument("--threads", type=int, default=cores,
                    help=f"intra_op_thread_count of both models, and the in-process loop's (default {cores}: "
                         "this machine's cores, what shmserve picks for one instance)")
    ap.add_argument("--protocols", nargs="+", choices=tuple(PROTOCOLS), default=list(PROTOCOLS))
    ap.add_argument("--tiny-concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--heavy-concurrency", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--heavy-blocks", type=int, default=6, help="512 -> 2048 -> 512 blocks of heavy (default 6)")
    ap.add_argument("--heavy-delay-us", type=int, default=2000, help="heavy's max_queue_delay_microseconds (2000)")
    ap.add_argument("--window-ms", type=int, help="perf_analyzer's window (-p), default 2000 (--quick 500)")
    ap.add_argument("--max-trials", type=int, help="perf_analyzer's --max-trials, default 10 (--quick 6)")
    ap.add_argument("--stability", type=int, help="perf_analyzer's -s (percent), default 20 (--quick 100)")
    ap.add_argument("--inprocess-s", type=float, help="in-process seconds per batch size, default 1 (--quick 0.2)")
    ap.add_argument("--tiny-min-runs", type=int, help="in-process runs of tiny per batch size, at least "
                                                      "(default 5000, --quick 500)")
    ap.add_argument("--keep-models", action="store_true", help="keep the .onnx files in the results folder")
    add_server_arguments(ap)
    add_steal_arguments(ap)
    args = ap.parse_args()
    quick = args.quick
    for key, normal, short in (("window_ms", 2000, 500), ("max_trials", 10, 6), ("stability", 20, 100),
                               ("inprocess_s", 1.0, 0.2), ("tiny_min_runs", 5000, 500)):
        if getattr(args, key) is None:
            setattr(args, key, short if quick else normal)
    if quick:
        args.steal_reruns = 0
    args.measurement_args = measurement_args(args, args.stability)
    return args


def measurement_args(args, stability: int) -> list[str]:
    return ["-p", str(args.window_ms), "--max-trials", str(args.max_trials), "-s", str(stability)]


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    env, out_dir, _, names = new_run(args, "backends")
    models = [Model("tiny", [("INPUT0", TINY_COLS), ("INPUT1", TINY_COLS)], TINY_COLS, 0, args.tiny_concurrency),
              Model("heavy", [("INPUT0", HEAVY_WIDTH)], HEAVY_WIDTH, args.heavy_delay_us, args.heavy_concurrency)]
    errors, records = [], []
    triton_ort, triton_venv = triton_onnxruntime(env)
    if "triton" in names and triton_ort is None:
        errors.append(f"the anchors' Triton venv cannot import onnxruntime ({triton_venv}); install it as this "
                      "script's docstring says. Triton not measured")
        names = [n for n in names if n != "triton"]
    shm_ort = subprocess.run([ShmServer.python(), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                             stdout=subprocess.PIPE, text=True).stdout.strip() or None
    versions = {"shmserve": shm_ort, "triton": triton_ort}
    meta = run_metadata(args, env, onnxruntime=versions, triton_venv=triton_venv)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    try:
        shm_repo, triton_repo, files = write_repositories(out_dir, models, args)
        servers = {"triton": TritonServer(args.anchors, env, triton_repo, out_dir / "triton.log"),
                   "shmserve": ShmServer(shm_repo, tuple(args.shmserve_ports), out_dir / "shmserve.log")}
        pa = (env["PERF_ANALYZER"], env["PA_LD"])
        import onnxruntime as ort  # here only for the output checks
        sessions = {m.name: ort.InferenceSession(str(files[m.name]), providers=["CPUExecutionProvider"])
                    for m in models}

        for model in models:
            rec = dict(kind="inprocess", model=model.name,
                       **measure_steady(lambda model=model: run_inprocess(model, files[model.name], args),
                                        args.max_steal, args.steal_reruns))
            records.append(rec)
            print(json.dumps(rec), file=sys.stderr, flush=True)
        options = [r["options"] for r in records if r["kind"] == "inprocess" and r["error"] is None]
        args.inprocess_options = options[0] if options else None

        def run_one(server: Server) -> list[str]:
            def measure_all(errs):
                return check_and_measure(server, models, pa, out_dir, args, sessions, records, errs)

            if server.name != "triton":
                return serve_and_measure(server, measure_all)
            with anchor_triton_lock():
                return serve_and_measure(server, measure_all)

        errors += run_servers(servers, names, out_dir, records, run_one)
    finally:
        if not args.keep_models:
            remove_model_files(out_dir)
    errors += [f"in-process {r['model']}: {r['error']}" for r in records if r["kind"] == "inprocess" and r["error"]]
    errors += [f"{r['server']} {r['model']} {r['protocol']} c={r['concurrency']}"
               f"{' (also at -s %d)' % r['retried_with_s'] if r.get('retried_with_s') else ''}: {r['error']}"
               for r in records if r["kind"] == "perf_analyzer" and r["error"]]
    if versions["triton"] and versions["shmserve"] and versions["triton"] != versions["shmserve"]:
        errors.append(f"onnxruntime differs: {versions['shmserve']} for shmserve, {versions['triton']} "
                      "in Triton's venv")
    text = report(records, models, args, versions, time.monotonic() - started) + interpreters_line(env)
    return publish(out_dir, text, errors)


if __name__ == "__main__":
    sys.exit(main())
