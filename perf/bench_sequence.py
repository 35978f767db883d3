"""Benchmark the sequence batcher on the real Triton and on shmserve, in one run: perf_analyzer's
sequence mode against `accumulate` (direct strategy, 8 slots) and `accumulate_oldest` (oldest
strategy, 16 candidate sequences), a running sum per sequence.

    .venv/bin/python perf/bench_sequence.py [--only triton|shmserve] [--concurrency 1 8 16]
                                            [--protocols grpc http] [--models accumulate ...]

Both servers serve perf/triton_repo/ (the same model files), one after the other, never
together. Each is first checked for correct running sums with tritonclient (perf_analyzer never
looks at outputs), then measured by perf_analyzer per model, protocol and concurrency, then
stopped by its PID, also on failure. Prints a markdown table (ratios shmserve / Triton) and writes
everything under perf/results/sequence-<date>-<time>/.
"""
import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pa_runner import measure
from servers import add_server_arguments, new_run, run_metadata, Server, ServerError, tree_cpu_seconds, fmt, ratio, markdown_row, publish, run_servers, serve_and_measure

MODELS = ("accumulate", "accumulate_oldest")
CHECK_SEQUENCES = 16  # more than accumulate's 8 slots: some sequences wait for a free one
CHECK_LENGTH = 10
CHECK_TIMEOUT_S = 30


def make_client(module, server: Server):
    if module is grpcclient:
        return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=CHECK_TIMEOUT_S)


def infer_step(client, module, model: str, value: int, sequence_id: int, start: bool, end: bool) -> int:
    """One request of a sequence; returns OUTPUT, the running sum."""
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    kwargs = dict(client_timeout=CHECK_TIMEOUT_S) if module is grpcclient else {}
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end, **kwargs)
    out = result.as_numpy("OUTPUT")
    if out is None or out.dtype != np.int32 or out.shape != (1, 1):
        raise ServerError(f"{model}: OUTPUT {out!r} is not INT32 [1, 1]")
    return int(out[0, 0])


def check_interleaved(server: Server, model: str) -> None:
    """Two sequences interleaved on one connection, over gRPC and HTTP; then the first id is
    started again after its END, and must count from zero."""
    a, b = 1001, 1002
    steps = [  # (sequence id, value, start, end, expected running sum)
        (a, 1, True, False, 1), (b, 10, True, False, 10), (b, 20, False, False, 30), (a, 2, False, False, 3),
        (a, 3, False, True, 6), (b, 30, False, False, 60), (a, 100, True, False, 100), (b, 40, False, True, 100),
        (a, -7, False, True, 93)]
    for module in (grpcclient, httpclient):
        client = make_client(module, server)
        try:
            got = [infer_step(client, module, model, value, sid, start, end) for sid, value, start, end, _ in steps]
        finally:
            client.close()
        want = [step[-1] for step in steps]
        if got != want:
            raise ServerError(f"{server.name} {model} ({module.__name__}): running sums {got}, expected {want}")


def check_concurrent(server: Server, model: str) -> None:
    """CHECK_SEQUENCES sequences at once over gRPC, each one request at a time, so that the server
    batches requests of different sequences together (and, for `accumulate`, queues the sequences
    that find no free slot)."""
    failures = []

    def one_sequence(k: int) -> None:
        values = [k * 100 + i for i in range(CHECK_LENGTH)]
        client = make_client(grpcclient, server)
        try:
            got = [infer_step(client, grpcclient, model, v, 2000 + k, i == 0, i == CHECK_LENGTH - 1)
                   for i, v in enumerate(values)]
            want = np.cumsum(values).tolist()
            if got != want:
                failures.append(f"sequence {2000 + k}: {got}, expected {want}")
        except (InferenceServerException, ServerError) as e:
            failures.append(f"sequence {2000 + k}: {e}")
        finally:
            client.close()

    threads = [threading.Thread(target=one_sequence, args=(k,)) for k in range(CHECK_SEQUENCES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise ServerError(f"{server.name} {model}, {CHECK_SEQUENCES} concurrent sequences over gRPC: "
                          + "; ".join(failures[:3]) + (f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""))


def run_perf_analyzer(server: Server, model: str, protocol: str, concurrency: int, pa: tuple[str, str],
                      out_dir: Path, args) -> dict:
    port = server.grpc_port if protocol == "grpc" else server.http_port
    pa_args = ["-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol,
               "--concurrency-range", f"{concurrency}:{concurrency}",
               "--sequence-length", str(args.sequence_length),
               "--sequence-length-variation", str(args.sequence_length_variation)]
    cpu0, t0 = tree_cpu_seconds(server.pid), time.monotonic()
    m = measure(*pa, pa_args, out_dir / "pa" / f"{server.name}_{model}_{protocol}_c{concurrency}")
    cores = (tree_cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
    stats = m.server_stats
    avg_batch = stats["inference_count"] / stats["execution_count"] if stats and stats["execution_count"] else None
    return dict(server_cpu_cores=round(cores, 3), avg_batch=avg_batch, **vars(m))


def run_one(server: Server, cases, pa, out_dir: Path, args, records: list[dict]) -> list[str]:
    """Start, check and measure each model (a model whose check fails is not measured), stop.
    Appends to records as it goes; returns what went wrong."""
    def measure_all(errors: list[str]) -> None:
        for model in args.models:
            try:
                server.wait_model_ready(model)
                check_interleaved(server, model)
                check_concurrent(server, model)
            except (ServerError, InferenceServerException) as e:
                errors.append(f"{server.name} {model} check: {e}")
                continue
            for protocol, concurrency in cases:
                rec = dict(server=server.name, model=model, protocol=protocol, concurrency=concurrency,
                           **run_perf_analyzer(server, model, protocol, concurrency, pa, out_dir, args))
                print(json.dumps(rec), file=sys.stderr, flush=True)
                records.append(rec)

    return serve_and_measure(server, measure_all)


def table(records: list[dict], models, cases) -> str:
    ok = {(r["server"], r["model"], r["protocol"], r["concurrency"]): r for r in records if r["error"] is None}
    lines = [markdown_row(["model", "protocol", "conc", "infer/s T / S", "infer/s ratio", "p99 ms T / S", "p99 ratio",
                           "p50 ms T / S", "avg batch T / S", "server queue µs T / S", "server CPU cores T / S"]),
             markdown_row(["---", "---", "---:"] + ["---:"] * 8)]
    for model in models:
        for protocol, concurrency in cases:
            t = ok.get(("triton", model, protocol, concurrency), {})
            s = ok.get(("shmserve", model, protocol, concurrency), {})

            def pair(key, spec, t=t, s=s):
                return f"{fmt(t.get(key), spec)} / {fmt(s.get(key), spec)}"

            def queue(r):
                return (r.get("server_stats") or {}).get("queue_us")

            lines.append(markdown_row([
                model, protocol, str(concurrency), pair("infer_per_s", ",.0f"),
                fmt(ratio(s.get("infer_per_s"), t.get("infer_per_s")), ".2f"), pair("p99_ms", ".2f"),
                fmt(ratio(s.get("p99_ms"), t.get("p99_ms")), ".2f"), pair("p50_ms", ".2f"),
                pair("avg_batch", ".1f"), f"{fmt(queue(t), '.0f')} / {fmt(queue(s), '.0f')}",
                pair("server_cpu_cores", ".2f")]))
    return "\n".join(lines)


def report(records: list[dict], cases, args, elapsed_s: float) -> str:
    parts = [
        "### perf_analyzer, sequence models (T = Triton, S = shmserve; ratio = shmserve / Triton)\n",
        table(records, args.models, cases),
        f"\nRatios above 1 are better for infer/s, below 1 better for latency. --sequence-length "
        f"{args.sequence_length} --sequence-length-variation {args.sequence_length_variation}, concurrency = "
        "live sequences (accumulate has 8 slots: above 8, sequences wait for one). avg batch = server inference "
        "count / execution count; server queue = perf_analyzer's server-side average; server CPU = the "
        "server's process tree over the perf_analyzer run. perf_analyzer -p 3000 --max-trials 20. "
        f"Run time {elapsed_s / 60:.1f} min."]
    return "\n".join(parts)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--protocols", nargs="+", choices=("grpc", "http"), default=["grpc", "http"])
    ap.add_argument("--sequence-length", type=int, default=20, help="requests per sequence (default 20)")
    ap.add_argument("--sequence-length-variation", type=float, default=20,
                    help="+/- percent around --sequence-length (default 20, perf_analyzer's own)")
    add_server_arguments(ap)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    env, out_dir, servers, names = new_run(args, "sequence")
    cases = [(p, c) for p in args.protocols for c in args.concurrency]
    pa = (env["PERF_ANALYZER"], env["PA_LD"])
    (out_dir / "meta.json").write_text(json.dumps(run_metadata(args, env, models=args.models), indent=1, default=str))

    records = []
    errors = run_servers(servers, names, out_dir, records,
                         lambda server: run_one(server, cases, pa, out_dir, args, records))
    errors += [f"{r['server']} {r['model']} {r['protocol']} c={r['concurrency']}: {r['error']}"
               for r in records if r["error"]]
    return publish(out_dir, report(records, cases, args, time.monotonic() - started), errors)


if __name__ == "__main__":
    sys.exit(main())
