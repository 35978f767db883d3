"""Benchmark identity_fp32 (FP32 [1,16], 64 B, dynamic batching up to 64) on the real Triton and on
shmserve, in one run, with perf_analyzer and with our own load generator (loadgen.py).

    .venv/bin/python perf/bench_identity.py [--only triton|shmserve] [--reps N] [--no-loadgen]
                                            [--concurrency 1 8 32 64] [--protocols grpc http]
                                            [--model identity_fp32_20ms|identity_fp32_delay150]

Both servers serve perf/triton_repo/ (the same model files). They run one after the other, never
together, so neither takes CPU from the other; with --reps > 1 the order alternates. Each one is
checked for correct outputs, measured by perf_analyzer and then by loadgen.py, and stopped by its
PID afterwards, also on failure. Prints markdown tables (the ratios shmserve / Triton against the
target first) and writes everything under perf/results/.

`--model identity_fp32_20ms` runs the same identity behind 20 ms per execute() at any batch size (a
stand-in for a GPU model), where throughput follows how many requests each batch holds;
`--model identity_fp32_delay150` the same identity_fp32 with max_queue_delay_microseconds 150 on
both servers, where batches wait for more requests; perf_analyzer only.
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

import loadgen
from pa_runner import measure
from servers import add_server_arguments, add_steal_arguments, end_run, interpreters_line, new_run, run_metadata, Server, SERVER_NAMES, ServerError, measure_steady, tree_cpu_seconds, split_cpu_seconds, thread_sched_seconds, children_cpu_seconds, fmt, ratio

MODELS = ("identity_fp32", "identity_fp32_20ms", "identity_fp32_delay150")
SHAPE = (1, 16)
TOOLS = ("perf_analyzer", "loadgen")
# The issue's target, per case: shmserve / Triton.
TARGET_MIN_THROUGHPUT = 1.0
TARGET_MAX_P99 = 1.2


def check_identity(server: Server, model: str) -> None:
    """perf_analyzer does not look at outputs: make sure the server really echoes the input."""
    data = np.random.default_rng().standard_normal(SHAPE).astype(np.float32)
    for module, port in ((grpcclient, server.grpc_port), (httpclient, server.http_port)):
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            tensor = module.InferInput("INPUT0", list(SHAPE), "FP32")
            tensor.set_data_from_numpy(data)
            out = client.infer(model, [tensor]).as_numpy("OUTPUT0")
        finally:
            client.close()
        if out is None or out.dtype != np.float32 or not np.array_equal(out, data):
            raise ServerError(f"{server.name} ({module.__name__}): OUTPUT0 {out!r} differs from INPUT0 {data!r}")


def port_of(server: Server, protocol: str) -> int:
    return server.grpc_port if protocol == "grpc" else server.http_port


def run_perf_analyzer(server: Server, protocol: str, concurrency: int, pa: tuple[str, str], out_dir: Path,
                      rep: int, model: str) -> dict:
    args = ["-m", model, "-u", f"127.0.0.1:{port_of(server, protocol)}", "-i", protocol,
            "--shape", f"INPUT0:{SHAPE[1]}", "--concurrency-range", f"{concurrency}:{concurrency}"]
    # Triton's front is many threads, so only shmserve's loop thread is followed.
    loop = thread_sched_seconds if server.name == "shmserve" else lambda pid: None
    (front0, model0), client0, loop0, t0 = (split_cpu_seconds(server.pid), children_cpu_seconds(),
                                            loop(server.pid), time.monotonic())
    m = measure(*pa, args, out_dir / "pa" / f"{server.name}_{protocol}_c{concurrency}_r{rep}")
    (front1, model1), client1, loop1 = split_cpu_seconds(server.pid), children_cpu_seconds(), loop(server.pid)
    wall = time.monotonic() - t0
    stats = m.server_stats
    avg_batch = stats["inference_count"] / stats["execution_count"] if stats and stats["execution_count"] else None
    looped = loop0 is not None and loop1 is not None
    return dict(server_cpu_cores=round((front1 + model1 - front0 - model0) / wall, 3),
                front_cpu_cores=round((front1 - front0) / wall, 3),
                model_cpu_cores=round((model1 - model0) / wall, 3),
                loop_run_cores=round((loop1[0] - loop0[0]) / wall, 3) if looped else None,
                loop_wait_cores=round((loop1[1] - loop0[1]) / wall, 3) if looped else None,
                client_cpu_cores=round((client1 - client0) / wall, 3), avg_batch=avg_batch, **vars(m))


def run_loadgen(server: Server, protocol: str, concurrency: int, args) -> dict:
    pid = server.pid
    try:
        r = loadgen.run(protocol, "127.0.0.1", port_of(server, protocol), concurrency, args.loadgen_procs,
                        args.loadgen_warmup, args.loadgen_windows, args.loadgen_window_s,
                        server_cpu=lambda: tree_cpu_seconds(pid))
    except (loadgen.LoadgenError, OSError) as e:
        return dict(error=str(e))
    return dict(vars(r), error=None)


def measure_server(server: Server, cases, pa: tuple[str, str], out_dir: Path, rep: int, args,
                   records: list[dict]) -> None:
    """Appends one record per measurement to records as it goes, so that an interruption keeps them."""
    tools = TOOLS if args.loadgen else TOOLS[:1]
    for tool in tools:
        for protocol, concurrency in cases:
            if tool == "perf_analyzer":
                def run(protocol=protocol, concurrency=concurrency):
                    return run_perf_analyzer(server, protocol, concurrency, pa, out_dir, rep, args.model)
            else:
                def run(protocol=protocol, concurrency=concurrency):
                    return run_loadgen(server, protocol, concurrency, args)
            figures = measure_steady(run, args.max_steal, args.steal_reruns)
            rec = dict(rep=rep, server=server.name, tool=tool, protocol=protocol, concurrency=concurrency, **figures)
            print(json.dumps(rec), file=sys.stderr, flush=True)
            records.append(rec)


def run_one(server: Server, cases, pa, out_dir: Path, rep: int, args, records: list[dict]) -> list[str]:
    """Start, check, measure (appending to records), stop. Returns what went wrong, if anything."""
    errors = []
    try:
        server.start()
        server.wait_model_ready(args.model)
        check_identity(server, args.model)
        measure_server(server, cases, pa, out_dir, rep, args, records)
    except (ServerError, OSError, subprocess.SubprocessError, grpcclient.InferenceServerException) as e:
        errors.append(f"{server.name} rep {rep}: {e}")
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"{server.name} rep {rep}: processes {leftovers} outlived the server (killed)")
    return errors


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


FIGURES = ("infer_per_s", "p50_ms", "p99_ms", "server_cpu_cores", "front_cpu_cores", "model_cpu_cores", "avg_batch",
           "loop_run_cores", "loop_wait_cores", "client_cpu_cores", "window_spread", "steal_cores")
BREAKDOWN = ("request_us", "queue_us", "compute_infer_us")


def summarize(records: list[dict], servers, cases, tools) -> dict:
    """(tool, server, protocol, concurrency) -> median over the successful reps of each figure,
    plus whether perf_analyzer printed the server-side breakdown in every one of them."""
    summary = {}
    for tool in tools:
        for name in servers:
            for protocol, concurrency in cases:
                runs = [r for r in records if r["error"] is None and
                        (r["tool"], r["server"], r["protocol"], r["concurrency"]) == (tool, name, protocol, concurrency)]
                s = {key: median(r.get(key) for r in runs) for key in FIGURES}
                stats = [r.get("server_stats") for r in runs]
                s.update({key: median(st[key] for st in stats if st) for key in BREAKDOWN})
                s["breakdown"] = None if not runs else all(stats)
                summary[tool, name, protocol, concurrency] = s
    return summary


def verdict(throughput_ratio, p99_ratio) -> str:
    if throughput_ratio is None or p99_ratio is None:
        return "–"
    missed = ([f"infer/s < {TARGET_MIN_THROUGHPUT}x"] if throughput_ratio < TARGET_MIN_THROUGHPUT else []) + \
             ([f"p99 > {TARGET_MAX_P99}x"] if p99_ratio > TARGET_MAX_P99 else [])
    return "FAIL: " + ", ".join(missed) if missed else "pass"


def pair(t: dict, s: dict, key: str, spec: str) -> str:
    return f"{fmt(t.get(key), spec)} / {fmt(s.get(key), spec)}"


def split(d: dict) -> str:
    """A server's CPU as front process + model processes, in cores."""
    return f"{fmt(d.get('front_cpu_cores'), '.2f')}+{fmt(d.get('model_cpu_cores'), '.2f')}"


def loop_split(d: dict) -> str:
    """shmserve's loop thread: running + ready and waiting for a core, in cores."""
    if d.get("loop_run_cores") is None:
        return "–"
    return f"{fmt(d.get('loop_run_cores'), '.2f')}+{fmt(d.get('loop_wait_cores'), '.2f')}"


def markdown_row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def target_table(summary: dict, cases, tools) -> tuple[str, dict]:
    """Ratios shmserve / Triton and the verdict per case and tool; also the verdict counts."""
    header = ["protocol", "conc"]
    for tool in tools:
        header += [f"{tool} infer/s", f"{tool} p50", f"{tool} p99", f"{tool} verdict"]
    lines = [markdown_row(header), markdown_row(["---", "---:"] + ["---:", "---:", "---:", "---"] * len(tools))]
    passed = {tool: [] for tool in tools}
    for protocol, concurrency in cases:
        cells = [protocol, str(concurrency)]
        for tool in tools:
            t, s = summary[tool, "triton", protocol, concurrency], summary[tool, "shmserve", protocol, concurrency]
            r = {key: ratio(s.get(key), t.get(key)) for key in ("infer_per_s", "p50_ms", "p99_ms")}
            v = verdict(r["infer_per_s"], r["p99_ms"])
            if v != "–":
                passed[tool].append(v == "pass")
            cells += [fmt(r["infer_per_s"], ".2f"), fmt(r["p50_ms"], ".2f"), fmt(r["p99_ms"], ".2f"), v]
        lines.append(markdown_row(cells))
    return "\n".join(lines), passed


def perf_analyzer_table(summary: dict, cases) -> str:
    lines = [markdown_row(["protocol", "conc", "infer/s", "p50 ms", "p99 ms", "avg batch", "server request µs",
                           "queue µs", "compute infer µs", "breakdown printed", "server CPU cores",
                           "front + model CPU cores", "shmserve loop thread: run + wait cores",
                           "perf_analyzer CPU cores", "host steal cores"]),
             markdown_row(["---", "---:"] + ["---:"] * 7 + ["---", "---:", "---:", "---:", "---:", "---:"])]

    def yes_no(v):
        return "–" if v is None else ("yes" if v else "NO")

    for protocol, concurrency in cases:
        t = summary["perf_analyzer", "triton", protocol, concurrency]
        s = summary["perf_analyzer", "shmserve", protocol, concurrency]
        lines.append(markdown_row([
            protocol, str(concurrency), pair(t, s, "infer_per_s", ",.0f"), pair(t, s, "p50_ms", ".2f"),
            pair(t, s, "p99_ms", ".2f"), pair(t, s, "avg_batch", ".1f"), pair(t, s, "request_us", ".0f"),
            pair(t, s, "queue_us", ".0f"), pair(t, s, "compute_infer_us", ".0f"),
            f"{yes_no(t['breakdown'])} / {yes_no(s['breakdown'])}", pair(t, s, "server_cpu_cores", ".2f"),
            f"{split(t)} / {split(s)}", loop_split(s), pair(t, s, "client_cpu_cores", ".2f"),
            pair(t, s, "steal_cores", ".2f")]))
    return "\n".join(lines)


def loadgen_table(summary: dict, cases) -> str:
    lines = [markdown_row(["protocol", "conc", "infer/s", "p50 ms", "p99 ms", "window spread",
                           "server CPU cores", "client CPU cores", "host steal cores"]),
             markdown_row(["---", "---:"] + ["---:"] * 7)]
    for protocol, concurrency in cases:
        t = summary["loadgen", "triton", protocol, concurrency]
        s = summary["loadgen", "shmserve", protocol, concurrency]
        lines.append(markdown_row([
            protocol, str(concurrency), pair(t, s, "infer_per_s", ",.0f"), pair(t, s, "p50_ms", ".2f"),
            pair(t, s, "p99_ms", ".2f"), pair(t, s, "window_spread", ".0%"), pair(t, s, "server_cpu_cores", ".2f"),
            pair(t, s, "client_cpu_cores", ".2f"), pair(t, s, "steal_cores", ".2f")]))
    return "\n".join(lines)


def report(records: list[dict], errors: list[str], cases, tools, args, elapsed_s: float) -> str:
    summary = summarize(records, SERVER_NAMES, cases, tools)
    target, passed = target_table(summary, cases, tools)
    met = "; ".join(f"{tool} {sum(p)} of {len(p)}" for tool, p in passed.items())
    parts = [
        f"### Target: shmserve / Triton, infer/s >= {TARGET_MIN_THROUGHPUT}x and p99 <= {TARGET_MAX_P99}x\n",
        target,
        f"\nTarget met in: {met} cases. Ratios above 1 are better for infer/s, below 1 better for latency.\n",
        "### perf_analyzer (each cell: Triton / shmserve)\n",
        perf_analyzer_table(summary, cases),
        "\navg batch = server inference count / execution count; server request, queue, compute infer = the "
        "server-side breakdown perf_analyzer printed (averages per request). Server CPU = the server's process "
        "tree over the whole perf_analyzer run, split into the front process (tritonserver, or shmserve's) and "
        "the model processes (python-backend stubs, or workers). shmserve's front runs its loop on one thread "
        "(tritonserver has many); the loop thread's column is its time on a core + its time ready to run "
        "but waiting for one (the kernel's schedstat). Under load, a sum near 1 means the loop was never "
        "idle, so it limits the throughput however little of a core it got; the wait is time other threads "
        "held its core (perf_analyzer's, woken by the answers the loop wrote). At low load the loop polls "
        "while a core is spare (--front-spin-us), which counts as running. perf_analyzer CPU = the client's own, "
        "over the same run. Host steal = CPU time the hypervisor took from this VM over the "
        f"run, in cores (of {os.cpu_count()}); a run above {args.max_steal:g} was taken again, up to "
        f"{args.steal_reruns} times.\n"]
    if "loadgen" in tools:
        parts += [
            "### loadgen.py (each cell: Triton / shmserve)\n",
            loadgen_table(summary, cases),
            f"\nloadgen.py: {args.loadgen_warmup:g} s warm-up, then {args.loadgen_windows} windows of "
            f"{args.loadgen_window_s:g} s; window spread = (max - min) / median of the per-window throughputs. "
            "CPU figures cover the measured windows only.\n"]
    parts.append(f"Medians over {args.reps} rep(s). Model {args.model}, FP32 {list(SHAPE)} (64 B), dynamic batching, "
                 f"max_batch_size 64. perf_analyzer -p 3000 --max-trials 20. Run time {elapsed_s / 60:.1f} min.")
    return "\n".join(parts) + "".join(f"\n- error: {e}" for e in errors)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1, help="full passes; the tables show medians (default 1)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--protocols", nargs="+", choices=("grpc", "http"), default=["grpc", "http"])
    ap.add_argument("--loadgen", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure with loadgen.py, after perf_analyzer (default on)")
    ap.add_argument("--loadgen-procs", type=int, help="loadgen worker processes (default: its own)")
    ap.add_argument("--loadgen-warmup", type=float, default=2.0, help="seconds (default 2)")
    ap.add_argument("--loadgen-windows", type=int, default=3, help="measured windows (default 3)")
    ap.add_argument("--loadgen-window-s", type=float, default=2.0, help="seconds per window (default 2)")
    ap.add_argument("--model", choices=MODELS, default=MODELS[0],
                    help="identity_fp32 (default); identity_fp32_20ms: 20 ms a batch; "
                         "identity_fp32_delay150: max_queue_delay_microseconds 150 "
                         "(perf_analyzer only)")
    add_server_arguments(ap)
    add_steal_arguments(ap)
    args = ap.parse_args()
    if args.model != MODELS[0]:
        args.loadgen = False  # loadgen.py drives identity_fp32 only
    return args


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    env, out_dir, servers, names = new_run(args, "identity")
    cases = [(p, c) for p in args.protocols for c in args.concurrency]
    tools = TOOLS if args.loadgen else TOOLS[:1]
    pa = (env["PERF_ANALYZER"], env["PA_LD"])
    (out_dir / "meta.json").write_text(json.dumps(run_metadata(args, env, model=args.model, shape=list(SHAPE)), indent=1, default=str))

    # SIGTERM must also reach the finally blocks that stop the servers and the loadgen workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    records, errors = [], []
    try:
        for rep in range(1, args.reps + 1):
            for name in (names if rep % 2 else names[::-1]):
                errs = run_one(servers[name], cases, pa, out_dir, rep, args, records)
                errors += errs
                for e in errs:
                    print(f"ERROR: {e}", file=sys.stderr)
    except KeyboardInterrupt:  # report what was measured so far
        errors.append("interrupted (Ctrl-C)")
    finally:
        end_run(servers, out_dir, records)

    errors += [f"{r['server']} {r['tool']} {r['protocol']} c={r['concurrency']} rep {r['rep']}: {r['error']}"
               for r in records if r["error"]]
    errors += [f"{r['server']} perf_analyzer {r['protocol']} c={r['concurrency']} rep {r['rep']}: "
               "no server-side breakdown in perf_analyzer's output"
               for r in records if r["tool"] == "perf_analyzer" and r["error"] is None and r["server_stats"] is None]
    text = report(records, errors, cases, tools, args, time.monotonic() - started)
    text += interpreters_line(env)
    (out_dir / "table.md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {out_dir}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
