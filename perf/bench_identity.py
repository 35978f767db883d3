"""Benchmark identity_fp32 (FP32 [1,16], 64 B) on the real Triton and on shmserve, in one run.

    .venv/bin/python perf/bench_identity.py [--only triton|shmserve] [--reps N]
                                            [--concurrency 1 8 32] [--protocols grpc http]

Both servers serve perf/triton_repo/ (the same model files). They run one after the other, never
together, so neither takes CPU from the other; with --reps > 1 the order alternates. Each one is
checked for correct outputs before perf_analyzer measures it, and stopped by its PID afterwards,
also on failure. Prints a markdown table and writes everything under perf/results/.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pa_runner import Measurement, measure
from servers import REPO_ROOT, Server, ServerError, ShmServer, TritonServer, anchors_env, tree_cpu_seconds

MODEL = "identity_fp32"
SHAPE = (1, 16)
PERF_DIR = Path(__file__).resolve().parent
SERVER_NAMES = ("triton", "shmserve")


def check_identity(server: Server) -> None:
    """perf_analyzer does not look at outputs: make sure the server really echoes the input."""
    data = np.random.default_rng().standard_normal(SHAPE).astype(np.float32)
    for module, port in ((grpcclient, server.grpc_port), (httpclient, server.http_port)):
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            tensor = module.InferInput("INPUT0", list(SHAPE), "FP32")
            tensor.set_data_from_numpy(data)
            out = client.infer(MODEL, [tensor]).as_numpy("OUTPUT0")
        finally:
            client.close()
        if out is None or out.dtype != np.float32 or not np.array_equal(out, data):
            raise ServerError(f"{server.name} ({module.__name__}): OUTPUT0 {out!r} differs from INPUT0 {data!r}")


def measure_server(server: Server, cases, pa: tuple[str, str], out_dir: Path, rep: int) -> list[dict]:
    records = []
    for protocol, concurrency in cases:
        port = server.grpc_port if protocol == "grpc" else server.http_port
        args = ["-m", MODEL, "-u", f"127.0.0.1:{port}", "-i", protocol, "--shape", f"INPUT0:{SHAPE[1]}",
                "--concurrency-range", f"{concurrency}:{concurrency}"]
        cpu0, t0 = tree_cpu_seconds(server.pid), time.monotonic()
        m = measure(*pa, args, out_dir / "pa" / f"{server.name}_{protocol}_c{concurrency}_r{rep}")
        cores = (tree_cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
        rec = dict(rep=rep, server=server.name, protocol=protocol, concurrency=concurrency,
                   server_cpu_cores=round(cores, 3), **vars(m))
        print(json.dumps(rec), file=sys.stderr, flush=True)
        records.append(rec)
    return records


def run_one(server: Server, cases, pa, out_dir: Path, rep: int) -> tuple[list[dict], list[str]]:
    """Start, check, measure, stop. Returns the records and what went wrong, if anything."""
    records, errors = [], []
    try:
        server.start()
        server.wait_model_ready(MODEL)
        check_identity(server)
        records = measure_server(server, cases, pa, out_dir, rep)
    except (ServerError, OSError, subprocess.SubprocessError, grpcclient.InferenceServerException) as e:
        errors.append(f"{server.name} rep {rep}: {e}")
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"{server.name} rep {rep}: processes {leftovers} outlived the server (killed)")
    return records, errors


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(records: list[dict], servers, cases) -> dict:
    """(server, protocol, concurrency) -> median over reps of each figure."""
    summary = {}
    for name in servers:
        for protocol, concurrency in cases:
            runs = [r for r in records if (r["server"], r["protocol"], r["concurrency"]) == (name, protocol, concurrency)]
            summary[name, protocol, concurrency] = {
                key: median(r[key] for r in runs if r["error"] is None)
                for key in ("infer_per_s", "p50_ms", "p99_ms", "server_cpu_cores")}
    return summary


def markdown_table(summary: dict, cases) -> str:
    fmt = lambda v, spec: "–" if v is None else format(v, spec)
    ratio = lambda s, t: "–" if s is None or t is None or t == 0 else f"{s / t:.2f}"
    lines = [
        "| protocol | conc | Triton infer/s | shmserve infer/s | ratio | Triton p50 ms | shmserve p50 ms | ratio "
        "| Triton p99 ms | shmserve p99 ms | ratio | server CPU cores Triton / shmserve |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for protocol, concurrency in cases:
        t, s = summary.get(("triton", protocol, concurrency), {}), summary.get(("shmserve", protocol, concurrency), {})
        cells = [protocol, str(concurrency)]
        for key, spec in (("infer_per_s", ",.0f"), ("p50_ms", ".2f"), ("p99_ms", ".2f")):
            cells += [fmt(t.get(key), spec), fmt(s.get(key), spec), ratio(s.get(key), t.get(key))]
        cells.append(f"{fmt(t.get('server_cpu_cores'), '.2f')} / {fmt(s.get('server_cpu_cores'), '.2f')}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_metadata(args, env: dict[str, str]) -> dict:
    git = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    head = git.stdout.strip() if git.returncode == 0 else None
    return dict(started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), git_head=head,
                cpus=os.cpu_count(), model=MODEL, shape=list(SHAPE), anchors=str(args.anchors),
                perf_analyzer=env["PERF_ANALYZER"], shmserve_command=ShmServer.command(), args=vars(args))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=SERVER_NAMES, help="measure one server only")
    ap.add_argument("--reps", type=int, default=1, help="full passes; the table shows medians (default 1)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--protocols", nargs="+", choices=("grpc", "http"), default=["grpc", "http"])
    ap.add_argument("--anchors", type=Path, default=Path(os.environ.get("ANCHORS", Path.home() / "shmserve-anchors")),
                    help="the anchors' directory (Triton, perf_analyzer); default $ANCHORS or ~/shmserve-anchors")
    ap.add_argument("--shmserve-ports", type=int, nargs=3, default=[18100, 18101, 18102],
                    metavar=("HTTP", "GRPC", "METRICS"))
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    env = anchors_env(args.anchors)
    out_dir = PERF_DIR / "results" / time.strftime("identity-%Y%m%d-%H%M%S")
    (out_dir / "pa").mkdir(parents=True)
    repo = PERF_DIR / "triton_repo"
    servers = {
        "triton": TritonServer(args.anchors, env, repo, out_dir / "triton.log"),
        "shmserve": ShmServer(repo, tuple(args.shmserve_ports), out_dir / "shmserve.log"),
    }
    names = [args.only] if args.only else list(SERVER_NAMES)
    cases = [(p, c) for p in args.protocols for c in args.concurrency]
    pa = (env["PERF_ANALYZER"], env["PA_LD"])
    (out_dir / "meta.json").write_text(json.dumps(run_metadata(args, env), indent=1, default=str))

    # SIGTERM must also reach the finally blocks that stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    records, errors = [], []
    try:
        for rep in range(1, args.reps + 1):
            for name in (names if rep % 2 else names[::-1]):
                recs, errs = run_one(servers[name], cases, pa, out_dir, rep)
                records += recs
                errors += errs
                for e in errs:
                    print(f"ERROR: {e}", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
        with open(out_dir / "results.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    errors += [f"{r['server']} {r['protocol']} c={r['concurrency']} rep {r['rep']}: {r['error']}"
               for r in records if r["error"]]
    table = markdown_table(summarize(records, names, cases), cases)
    notes = ("\nratio = shmserve / Triton: above 1 is better for infer/s, below 1 is better for latency. "
             f"Medians over {args.reps} rep(s). Model {MODEL}, FP32 {list(SHAPE)} (64 B), perf_analyzer "
             "-p 3000 --max-trials 20. Server CPU = the server's process tree, over the perf_analyzer run.\n")
    report = table + "\n" + notes + "".join(f"\n- error: {e}" for e in errors)
    (out_dir / "table.md").write_text(report + "\n")
    print(report)
    print(f"\nresults: {out_dir}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
