"""Benchmark decoupled streaming on the real Triton and on shmserve, in one run: the `repeat`
model (INT32 [100] in, 100 responses out) over a gRPC bidirectional stream.

    .venv/bin/python perf/bench_streaming.py [--only triton|shmserve] [--concurrency 1 8 32]
                                             [--latency-rounds 3] [--textgen | --no-textgen]

For each server (one after the other, never together, both serving perf/triton_repo/, the same
model files): perf_analyzer --streaming at each concurrency (responses/s = infer/s x 100). Then
time to first and to last response with one request in flight (perf_analyzer reports only one
latency), in rounds that alternate the servers, each started afresh; the table gives the median
of the rounds. Then, shmserve only, `textgen` from model_repository/: tokens/s and time to first
token at concurrency 1 and 16. Prints markdown tables (ratios shmserve / Triton against the
target first) and writes everything under perf/results/.
"""
import argparse
import json
import queue
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from pa_runner import measure
from servers import (add_server_arguments, add_steal_arguments, interpreters_line, measure_steady, new_run, REPO_ROOT, Server,
                     ServerError, ShmServer, serve_and_measure, tree_cpu_seconds, fmt, ratio)

MODEL = "repeat"
RESPONSES = 100
TARGET_MIN_RESPONSES = 1.5  # responses/s, shmserve / Triton
TARGET_MAX_FIRST = 1.0  # time to first response at concurrency 1, shmserve / Triton
LATENCY_REQUESTS = 300
LATENCY_KEYS = ("first_ms_p50", "first_ms_p99", "last_ms_p50", "last_ms_p99")
TEXTGEN_TOKENS = 64


class StreamClient:
    """One gRPC stream; requests go out one at a time, responses are timed as they arrive."""

    def __init__(self, port: int):
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put(
            (time.perf_counter(), result, error)))

    def request(self, model: str, inputs: list, **kwargs) -> tuple[float, float, int]:
        """(seconds to the first response, seconds to the final one, responses with data)."""
        start = time.perf_counter()
        self.client.async_stream_infer(model, inputs, enable_empty_final_response=True, **kwargs)
        first, count = None, 0
        while True:
            t, result, error = self.responses.get(timeout=60)
            if error is not None:
                raise ServerError(f"{model}: {error}")
            response = result.get_response()
            if response.outputs:
                count += 1
                first = first or t
            if response.parameters["triton_final_response"].bool_param:
                return (first or t) - start, t - start, count

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def repeat_input() -> list:
    tensor = grpcclient.InferInput("IN", [RESPONSES], "INT32")
    tensor.set_data_from_numpy(np.arange(RESPONSES, dtype=np.int32))
    return [tensor]


def stream_latency(server: Server) -> dict:
    """Time to first and to last response, one request in flight (after a warm-up)."""
    client = StreamClient(server.grpc_port)
    try:
        firsts, lasts = [], []
        for i in range(LATENCY_REQUESTS + 20):
            first, last, count = client.request(MODEL, repeat_input())
            if count != RESPONSES:
                raise ServerError(f"{server.name}: {count} responses instead of {RESPONSES}")
            if i >= 20:
                firsts.append(first * 1000)
                lasts.append(last * 1000)
    finally:
        client.close()
    return dict(first_ms_p50=statistics.median(firsts), first_ms_p99=np.percentile(firsts, 99),
                last_ms_p50=statistics.median(lasts), last_ms_p99=np.percentile(lasts, 99))


def run_perf_analyzer(server: Server, concurrency: int, pa, out_dir: Path, data_file: Path) -> dict:
    args = ["-m", MODEL, "-u", f"127.0.0.1:{server.grpc_port}", "-i", "grpc", "--streaming",
            "--input-data", str(data_file), "--concurrency-range", f"{concurrency}:{concurrency}"]
    cpu0, t0 = tree_cpu_seconds(server.pid), time.monotonic()
    m = measure(*pa, args, out_dir / "pa" / f"{server.name}_c{concurrency}")
    cores = (tree_cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
    responses = None if m.infer_per_s is None else m.infer_per_s * RESPONSES
    return dict(server_cpu_cores=round(cores, 3), responses_per_s=responses, **vars(m))


def textgen(server: Server, concurrency: int, requests_each: int = 4) -> dict:
    """Tokens/s over all streams and time to first token, `concurrency` streams at once."""
    results, errors = [], []

    def one_stream(k):
        client = StreamClient(server.grpc_port)
        try:
            for i in range(requests_each):
                inputs = []
                for name, value, datatype in (("text_input", np.array([b"We hold these"], np.object_), "BYTES"),
                                              ("max_tokens", np.array([TEXTGEN_TOKENS], np.int32), "INT32"),
                                              ("stream", np.array([True]), "BOOL"),
                                              ("seed", np.array([k * 100 + i], np.uint64), "UINT64")):
                    t = grpcclient.InferInput(name, list(value.shape), datatype)
                    t.set_data_from_numpy(value)
                    inputs.append(t)
                results.append(client.request("textgen", inputs))
        except Exception as e:  # reported, not raised: the other streams' figures still count
            errors.append(repr(e))
        finally:
            client.close()

    threads = [threading.Thread(target=one_stream, args=(k,)) for k in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    tokens = sum(count for _, _, count in results)
    firsts = [first * 1000 for first, _, _ in results]
    return dict(concurrency=concurrency, requests=len(results), tokens=tokens,
                tokens_per_s=tokens / elapsed if elapsed else None,
                first_token_ms_p50=statistics.median(firsts) if firsts else None,
                first_token_ms_max=max(firsts) if firsts else None, errors=errors)


def run_one(server: Server, concurrencies, pa, out_dir: Path, data_file: Path, records: list, args) -> list[str]:
    errors = []
    try:
        server.start()
        server.wait_model_ready(MODEL)
        for c in concurrencies:
            rec = dict(server=server.name, kind="perf_analyzer", concurrency=c,
                       **measure_steady(lambda c=c: run_perf_analyzer(server, c, pa, out_dir, data_file),
                                        args.max_steal, args.steal_reruns))
            print(json.dumps(rec), file=sys.stderr, flush=True)
            records.append(rec)
    except (ServerError, OSError, grpcclient.InferenceServerException, queue.Empty) as e:
        errors.append(f"{server.name}: {e!r}")
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"{server.name}: processes {leftovers} outlived the server (killed)")
    return errors


def run_latency_rounds(servers: dict, names, rounds: int, records: list, args) -> list[str]:
    """Time to first and to last response in `rounds` rounds, each server started afresh
    once per round, in alternating order. One pass of each server, minutes apart, differed by
    a fifth from one run to the next on this shared host: more than the gap measured. The
    medians of the rounds go in one "latency" record per server."""
    errors, rounds_of = [], {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else list(reversed(names))):
            server = servers[name]

            def one_round(errs, server=server, r=r):
                try:
                    server.wait_model_ready(MODEL)
                    rec = dict(server=server.name, kind="latency_round", round=r,
                               **measure_steady(lambda: stream_latency(server), args.max_steal,
                                                args.steal_reruns))
                except (grpcclient.InferenceServerException, queue.Empty) as e:
                    errs.append(f"{server.name}, latency round {r}: {e!r}")
                    return
                print(json.dumps(rec), file=sys.stderr, flush=True)
                records.append(rec)
                rounds_of[server.name].append(rec)
            errors += serve_and_measure(server, one_round)
    for name, recs in rounds_of.items():
        if recs:
            records.append(dict(server=name, kind="latency", rounds=len(recs),
                                **{key: statistics.median(rec[key] for rec in recs)
                                   for key in LATENCY_KEYS},
                                first_ms_p50_rounds=[rec["first_ms_p50"] for rec in recs],
                                steal_cores=max(rec["steal_cores"] for rec in recs)))
    return errors


def run_textgen(args, out_dir: Path, records: list) -> list[str]:
    server = ShmServer(REPO_ROOT / "model_repository", tuple(args.shmserve_ports), out_dir / "textgen.log")
    errors = []
    try:
        server.start()
        server.wait_model_ready("textgen")
        for c in (1, 16):
            rec = dict(server=server.name, kind="textgen", **textgen(server, c))
            print(json.dumps(rec), file=sys.stderr, flush=True)
            records.append(rec)
    except (ServerError, OSError) as e:
        errors.append(f"textgen: {e!r}")
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"textgen: processes {leftovers} outlived the server (killed)")
    return errors


def report(records: list, errors: list, concurrencies) -> str:
    pa = {(r["server"], r["concurrency"]): r for r in records if r["kind"] == "perf_analyzer"}
    lat = {r["server"]: r for r in records if r["kind"] == "latency"}
    lines = [f"## repeat, {RESPONSES} responses per request, gRPC stream (perf_analyzer --streaming)", "",
             "| concurrency | Triton resp/s | shmserve resp/s | ratio (target ≥ 1.5) | Triton / shmserve server cores "
             "| Triton / shmserve host steal cores |",
             "|---|---|---|---|---|---|"]
    for c in concurrencies:
        t, s = pa.get(("triton", c), {}), pa.get(("shmserve", c), {})
        r = ratio(s.get("responses_per_s"), t.get("responses_per_s"))
        ok = "" if r is None else (" ✓" if r >= TARGET_MIN_RESPONSES else " ✗")
        lines.append(f"| {c} | {fmt(t.get('responses_per_s'), ',.0f')} | {fmt(s.get('responses_per_s'), ',.0f')} | "
                     f"{fmt(r, '.2f')}{ok} | {fmt(t.get('server_cpu_cores'), '.2f')} / "
                     f"{fmt(s.get('server_cpu_cores'), '.2f')} | {fmt(t.get('steal_cores'), '.2f')} / "
                     f"{fmt(s.get('steal_cores'), '.2f')} |")
    t, s = lat.get("triton", {}), lat.get("shmserve", {})
    r = ratio(s.get("first_ms_p50"), t.get("first_ms_p50"))
    ok = "" if r is None else (" ✓" if r <= TARGET_MAX_FIRST else " ✗")
    rounds = max(t.get("rounds", 0), s.get("rounds", 0))
    lines += ["", f"One request in flight ({LATENCY_REQUESTS} requests a round), ms, the median of "
                  f"{rounds} alternating rounds:", "",
              "| | Triton | shmserve | ratio |", "|---|---|---|---|"]
    for key, label in zip(LATENCY_KEYS, ("first response p50 (target ≤ 1.0)", "first response p99",
                                         "last response p50", "last response p99")):
        rr = ratio(s.get(key), t.get(key))
        mark = ok if key == "first_ms_p50" else ""
        lines.append(f"| {label} | {fmt(t.get(key), '.3f')} | {fmt(s.get(key), '.3f')} | {fmt(rr, '.2f')}{mark} |")
    lines.append(f"| host steal cores (most of a round) | {fmt(t.get('steal_cores'), '.2f')} | "
                 f"{fmt(s.get('steal_cores'), '.2f')} | |")
    for name, rec in (("Triton", t), ("shmserve", s)):
        if rec.get("first_ms_p50_rounds"):
            lines.append(f"\n{name}'s first response p50 by round: "
                         + ", ".join(f"{v:.3f}" for v in rec["first_ms_p50_rounds"]))
    tg = [r for r in records if r["kind"] == "textgen"]
    if tg:
        lines += ["", f"## textgen on shmserve ({TEXTGEN_TOKENS} tokens per request, streamed over gRPC)", "",
                  "| concurrency | requests | tokens/s | first token p50 ms | first token max ms | errors |",
                  "|---|---|---|---|---|---|"]
        for r in tg:
            lines.append(f"| {r['concurrency']} | {r['requests']} | {fmt(r['tokens_per_s'], ',.0f')} | "
                         f"{fmt(r['first_token_ms_p50'], '.1f')} | {fmt(r['first_token_ms_max'], '.1f')} | "
                         f"{len(r['errors'])} |")
    if errors:
        lines += ["", "Errors:", *[f"- {e}" for e in errors]]
    return "\n".join(lines)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--latency-rounds", type=int, default=3,
                    help="alternating rounds of the one-request-in-flight latency (default 3)")
    ap.add_argument("--textgen", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure textgen on shmserve (default on)")
    add_server_arguments(ap)
    add_steal_arguments(ap)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    env, out_dir, servers, names = new_run(args, "streaming")
    # Only IN: perf_analyzer would otherwise fill the optional DELAY input with random delays.
    data_file = out_dir / "input.json"
    data_file.write_text(json.dumps({"data": [{"IN": {"content": list(range(RESPONSES)), "shape": [RESPONSES]}}]}))
    pa = (env["PERF_ANALYZER"], env["PA_LD"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    records, errors = [], []
    try:
        for name in names:
            errors += run_one(servers[name], args.concurrency, pa, out_dir, data_file, records, args)
        errors += run_latency_rounds(servers, names, args.latency_rounds, records, args)
        if args.textgen and args.only != "triton":
            errors += run_textgen(args, out_dir, records)
    except KeyboardInterrupt:
        errors.append("interrupted (Ctrl-C)")
    finally:
        for server in servers.values():
            server.stop()
        with open(out_dir / "results.jsonl", "w") as f:
            for rec in records:
                f.write(json.dumps(rec, default=float) + "\n")
    text = report(records, errors, args.concurrency) + interpreters_line(env)
    (out_dir / "report.md").write_text(text + "\n")
    print(text)
    print(f"\n(results in {out_dir})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
