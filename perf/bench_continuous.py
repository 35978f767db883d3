"""Continuous batching against request-level batching, on shmserve: the same transformer and the
same model.py, as `textgen_iterative` (sequence batcher with iterative sequences: one decode
step per execute(), requests join and leave between steps) and as `textgen_static` (dynamic
batching: one execute() runs its batch until the longest request is done).

    .venv/bin/python perf/bench_continuous.py [--concurrency 16] [--requests 8] [--seed 0]
                                              [--modes iterative static] [--reps 3] [--triton]

`--concurrency` clients, each on a gRPC stream (ModelStreamInfer) of its own, send their
`--requests` requests back to back: stream true, temperature 0, max_tokens drawn uniformly from
8..256 with `--seed`; both modes get the same list, `--reps` times. Per mode: tokens/s over the
whole run and time to first token per request (p50/p99). `--triton` adds the real Triton (the
anchors) running the same models as further series. Results under
perf/results/continuous-<time>/ (report.md, results.jsonl: one line per request and one summary
per pass, meta.json) and a plot in perf/continuous_batching.png when matplotlib is installed.
"""
import argparse
import asyncio
import json
import os
import struct
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from servers import (PERF_DIR, fmt, ServerError, ShmServer, TritonServer, add_server_arguments,
                     end_run, new_run, run_metadata, tree_cpu_seconds)

REPOSITORY = PERF_DIR / "continuous_repo"
MODELS = {"iterative": "textgen_iterative", "static": "textgen_static"}
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
PROMPTS = ("We hold these truths", "Once upon a midnight dreary", "Shall I compare thee",
           "In the beginning", "It was the best of times", "Call me", "The Lord is my",
           "Four score and seven")
TARGET_TOKENS = 2.0  # tokens/s, iterative / static, at least
TARGET_TTFT_P99 = 3.0  # time to first token p99, static / iterative, at least
PLOT = PERF_DIR / "continuous_batching.png"


@dataclass(frozen=True)
class Job:
    client: int
    index: int
    prompt: str
    max_tokens: int


def request_plan(concurrency: int, per_client: int, seed: int, lo: int, hi: int) -> list[list[Job]]:
    """Each client's requests in order: prompts in turn, max_tokens uniform in [lo, hi]."""
    draws = np.random.default_rng(seed).integers(lo, hi + 1, concurrency * per_client)
    return [[Job(c, i, PROMPTS[(c * per_client + i) % len(PROMPTS)], int(draws[c * per_client + i]))
             for i in range(per_client)] for c in range(concurrency)]


def tokens_per_step(plan: list[list[Job]], capacity: int, iterative: bool) -> float:
    """Tokens per decode step of one instance serving `plan`'s clients (each sends its next
    request when the one before is done): with `iterative`, every unfinished request decodes
    at every step and a new one joins at the next; without, a batch of the waiting requests
    (up to `capacity`) runs until its longest is done, and requests that arrive meanwhile
    wait for it. Where a step costs the same at any batch size (a memory-bound decode, as on
    a GPU), the ratio of the two is the most continuous batching can gain on this plan."""
    left = [list(reversed([job.max_tokens for job in jobs])) for jobs in plan]
    waiting = [c for c in range(len(plan)) if left[c]]
    steps = tokens = 0
    if iterative:
        active = {}  # client -> tokens still to make
        while waiting or active:
            while waiting and len(active) < capacity:
                c = waiting.pop(0)
                active[c] = left[c].pop()
            steps += 1
            tokens += len(active)
            for c in list(active):
                active[c] -= 1
                if active[c] == 0:
                    del active[c]
                    if left[c]:
                        waiting.append(c)
        return tokens / steps
    while waiting:
        batch, waiting = waiting[:capacity], waiting[capacity:]
        lengths = {c: left[c].pop() for c in batch}
        steps += max(lengths.values())
        tokens += sum(lengths.values())
        # Everyone in the batch is back in the queue by the time it ends, shortest first.
        waiting += sorted((c for c in batch if left[c]), key=lengths.get)
    return tokens / steps


def infer_request(model: str, job: Job) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=f"{job.client}.{job.index}")
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    prompt = job.prompt.encode()
    for name, datatype, raw in (("text_input", "BYTES", struct.pack("<I", len(prompt)) + prompt),
                                ("max_tokens", "INT32", struct.pack("<i", job.max_tokens)),
                                ("temperature", "FP32", struct.pack("<f", 0.0)),
                                ("stream", "BOOL", b"\x01")):
        request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
        request.raw_input_contents.append(raw)
    return request


def _text(raw: bytes) -> str:
    """The one string of a serialized BYTES tensor [1, 1]."""
    (size,) = struct.unpack_from("<I", raw)
    return raw[4:4 + size].decode()


async def _client(port: int, model: str, jobs: list[Job], records: list, errors: list) -> None:
    """One stream; each request waits for the final response of the one before."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(STREAM_METHOD,
                                     request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                     response_deserializer=service_pb2.ModelStreamInferResponse.FromString)()
        try:
            for job in jobs:
                start = time.perf_counter()
                await call.write(infer_request(model, job))
                first, pieces = None, []
                while True:
                    reply = await call.read()
                    if reply is grpc.aio.EOF:
                        raise ServerError(f"{model}: the stream ended before the final response")
                    if reply.error_message:
                        raise ServerError(f"{model}: {reply.error_message}")
                    response = reply.infer_response
                    if response.raw_output_contents:
                        first = first or time.perf_counter()
                        pieces.append(_text(response.raw_output_contents[0]))
                    if response.parameters["triton_final_response"].bool_param:
                        break
                end = time.perf_counter()
                records.append(dict(asdict(job), tokens=len(pieces), text="".join(pieces),
                                    ttft_ms=((first or end) - start) * 1e3,
                                    latency_ms=(end - start) * 1e3))
            await call.done_writing()
        except (ServerError, grpc.aio.AioRpcError) as e:  # the other clients' figures still count
            errors.append(f"client {jobs[0].client}: {e}")


async def _run_clients(port: int, model: str, plan: list[list[Job]]) -> tuple[list, list]:
    records, errors = [], []
    await asyncio.gather(*(_client(port, model, jobs, records, errors) for jobs in plan))
    return records, errors


def model_statistics(http_port: int, model: str) -> tuple[int, int]:
    """(inference count, execution count) from the statistics extension."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{model}/stats",
                                timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def percentile(values, q):
    return float(np.percentile(values, q)) if values else None


def measure(server, series: str, model: str, plan: list[list[Job]], rep: int) -> tuple[dict, list[dict]]:
    """Warm-up (one short request per client), then the plan; the summary of this pass and
    its per-request records."""
    warm = [[Job(c, -1, PROMPTS[0], 8)] for c in range(len(plan))]
    _, errors = asyncio.run(_run_clients(server.grpc_port, model, warm))
    if errors:
        raise ServerError(f"{series}: warm-up failed: {errors[0]}")
    inferences0, executions0 = model_statistics(server.http_port, model)
    cpu0, t0 = tree_cpu_seconds(server.pid), time.perf_counter()
    records, errors = asyncio.run(_run_clients(server.grpc_port, model, plan))
    wall = time.perf_counter() - t0
    cores = (tree_cpu_seconds(server.pid) - cpu0) / wall
    inferences, executions = model_statistics(server.http_port, model)
    inferences -= inferences0
    executions -= executions0
    ttft = [r["ttft_ms"] for r in records]
    tokens = sum(r["tokens"] for r in records)
    summary = dict(kind="summary", series=series, rep=rep, server=server.name, model=model,
                   requests=len(records), tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall,
                   ttft_ms_p50=percentile(ttft, 50), ttft_ms_p99=percentile(ttft, 99),
                   server_cpu_cores=cores, executions=executions,
                   avg_batch=inferences / executions if executions else None,
                   tokens_per_execute=tokens / executions if executions else None, errors=errors)
    for r in records:
        r.update(kind="request", series=series, rep=rep)
    return summary, records


def run_series(server, series_models: dict, plan, reps: int, records: list) -> list[str]:
    """Starts the server, measures each (series, model) `reps` times, the order reversed every
    other pass, and stops it; the errors."""
    errors = []
    try:
        server.start()
        for model in series_models.values():
            server.wait_model_ready(model)
        for rep in range(reps):
            order = list(series_models.items())
            for series, model in order[::-1] if rep % 2 else order:
                summary, requests = measure(server, series, model, plan, rep)
                print(json.dumps(summary), file=sys.stderr, flush=True)
                records += [summary, *requests]
                errors += [f"{series}: {e}" for e in summary["errors"]]
    except (ServerError, OSError) as e:
        errors.append(f"{server.name}: {e!r}")
    finally:
        leftovers = server.stop()
    if leftovers:
        errors.append(f"{server.name}: processes {leftovers} outlived the server (killed)")
    return errors


def aggregate(records: list) -> dict:
    """Per series, over its passes: tokens/s median, min and max; TTFT and latency percentiles
    over all its requests; means of the rest."""
    out = {}
    for series in dict.fromkeys(r["series"] for r in records if r["kind"] == "summary"):
        passes = [r for r in records if r["kind"] == "summary" and r["series"] == series]
        requests = [r for r in records if r["kind"] == "request" and r["series"] == series]
        ttft = [r["ttft_ms"] for r in requests]
        latency = [r["latency_ms"] for r in requests]
        speeds = [p["tokens_per_s"] for p in passes]

        def mean(key, passes=passes):
            values = [p[key] for p in passes if p[key] is not None]
            return sum(values) / len(values) if values else None

        out[series] = dict(
            series=series, server=passes[0]["server"], model=passes[0]["model"], passes=len(passes),
            requests=len(requests), tokens=sum(r["tokens"] for r in requests),
            tokens_per_s=float(np.median(speeds)), tokens_per_s_min=min(speeds),
            tokens_per_s_max=max(speeds), ttft_ms=ttft, ttft_ms_p50=percentile(ttft, 50),
            ttft_ms_p99=percentile(ttft, 99), ttft_ms_max=max(ttft, default=None),
            latency_ms_p50=percentile(latency, 50), latency_ms_p99=percentile(latency, 99),
            executions=mean("executions"), avg_batch=mean("avg_batch"),
            tokens_per_execute=mean("tokens_per_execute"), server_cpu_cores=mean("server_cpu_cores"))
    return out


def report(series: dict, records: list, errors: list, args, plan=None) -> str:
    lines = [f"## Continuous batching: textgen, {args.concurrency} streaming clients x "
             f"{args.requests} requests, max_tokens uniform {args.min_tokens}..{args.max_tokens} "
             f"(seed {args.seed}), temperature 0, gRPC stream, {args.reps} passes, "
             f"BLAS threads {args.blas_threads or 'default'}", "",
             "Tokens/s: median of the passes [min–max]; TTFT and latency: over the requests of all "
             "passes; executions, requests and tokens per execute (server statistics), server "
             "cores: means of the passes.", "",
             "| series | requests | tokens/s | TTFT p50 ms | TTFT p99 ms | TTFT max ms | "
             "latency p50 ms | latency p99 ms | executions | requests per execute | "
             "tokens per execute | server cores |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in series.values():
        lines.append(f"| {s['series']} ({s['server']}, {s['model']}) | {s['requests']} | "
                     f"{s['tokens_per_s']:,.0f} [{s['tokens_per_s_min']:,.0f}–{s['tokens_per_s_max']:,.0f}] | "
                     f"{fmt(s['ttft_ms_p50'], '.1f')} | {fmt(s['ttft_ms_p99'], '.1f')} | "
                     f"{fmt(s['ttft_ms_max'], '.1f')} | {fmt(s['latency_ms_p50'], '.0f')} | "
                     f"{fmt(s['latency_ms_p99'], '.0f')} | {fmt(s['executions'], '.0f')} | "
                     f"{fmt(s['avg_batch'], '.1f')} | {fmt(s['tokens_per_execute'], '.1f')} | "
                     f"{fmt(s['server_cpu_cores'], '.2f')} |")
    it, st = series.get("iterative"), series.get("static")
    if it and st and it["ttft_ms_p99"]:
        speed = it["tokens_per_s"] / st["tokens_per_s"]
        ttft = st["ttft_ms_p99"] / it["ttft_ms_p99"]
        lines += ["", "| target (shmserve) | measured | verdict |", "|---|---|---|",
                  f"| tokens/s iterative / static ≥ {TARGET_TOKENS} | {speed:.2f} | "
                  f"{'pass' if speed >= TARGET_TOKENS else 'FAIL'} |",
                  f"| TTFT p99 static / iterative ≥ {TARGET_TTFT_P99} | {ttft:.2f} | "
                  f"{'pass' if ttft >= TARGET_TTFT_P99 else 'FAIL'} |"]
    if plan is not None:
        capacity = args.concurrency  # the models' max_batch_size is 16, as the default
        it_rows, st_rows = (tokens_per_step(plan, capacity, mode) for mode in (True, False))
        lines += ["", f"Ceiling for this request plan: if a decode step cost the same at any "
                      f"batch size, iterative sequences would make {it_rows:.1f} tokens per step "
                      f"and request-level batching {st_rows:.1f}, a ratio of "
                      f"{it_rows / st_rows:.2f} (tokens_per_step())."]
    texts = {}
    for r in records:
        if r["kind"] == "request":
            texts.setdefault((r["client"], r["index"]), set()).add(r["text"])
    lines += ["", f"Greedy texts identical in every series and pass: {sum(len(t) == 1 for t in texts.values())} "
                  f"of {len(texts)} requests."]
    if errors:
        lines += ["", "Errors:", *[f"- {e}" for e in errors]]
    return "\n".join(lines)


def plot(series: dict, paths) -> str:
    """Tokens/s bars and TTFT CDFs; what happened, for the report."""
    try:
        import matplotlib
    except ImportError:
        return "no plot: matplotlib is not installed (.venv/bin/pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = list(series.values())
    heights = [s["tokens_per_s"] for s in rows]
    spread = [[h - s["tokens_per_s_min"] for h, s in zip(heights, rows)],
              [s["tokens_per_s_max"] - h for h, s in zip(heights, rows)]]
    bars.bar([f"{s['series']}\n({s['server']})" for s in rows], heights, yerr=spread, capsize=4,
             color=[f"C{i}" for i in range(len(rows))])
    for x, h in enumerate(heights):
        bars.annotate(f"{h:,.0f}", (x, h / 2), ha="center", color="white", weight="bold")
    bars.set_ylabel("tokens/s, all clients (median, min–max)")
    bars.set_title("Throughput")
    for i, s in enumerate(rows):
        ttft = np.sort(s["ttft_ms"])
        cdf.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", color=f"C{i}",
                 label=f"{s['series']} ({s['server']}), p99 {s['ttft_ms_p99']:.0f} ms")
    cdf.set_xscale("log")
    cdf.set_xlabel("time to first token, ms (log)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("Time to first token")
    cdf.legend(loc="lower right", fontsize="small")
    fig.suptitle("textgen: continuous batching (iterative sequences) vs request-level batching")
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return "plot: " + ", ".join(str(p) for p in paths)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=8, help="requests per client")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--modes", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--triton", action="store_true",
                    help="also run the models on the real Triton (the anchors); "
                         "--only triton runs that series alone")
    ap.add_argument("--reps", type=int, default=3, help="passes over each series (default 3)")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="OPENBLAS_NUM_THREADS for the servers (default 1; 0 leaves BLAS's default)")
    ap.add_argument("--plot", default=str(PLOT), help="where the PNG goes (also copied into the "
                                                      "run's folder)")
    add_server_arguments(ap)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    if args.blas_threads:
        # The servers inherit it. The model's matmuls are tiny ([<=16, 128] x [128, 512]):
        # BLAS threads gain nothing there and take cores from the front and the clients.
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
    env, out_dir, _, names = new_run(args, "continuous")
    plan = request_plan(args.concurrency, args.requests, args.seed, args.min_tokens, args.max_tokens)
    (out_dir / "meta.json").write_text(json.dumps(run_metadata(
        args, env, plan=[[asdict(job) for job in jobs] for jobs in plan]), indent=1, default=str))
    servers, runs = {}, []
    if "shmserve" in names:
        servers["shmserve"] = ShmServer(REPOSITORY, tuple(args.shmserve_ports), out_dir / "shmserve.log")
        runs.append(("shmserve", {mode: MODELS[mode] for mode in args.modes}))
    if args.triton or args.only == "triton":
        servers["triton"] = TritonServer(args.anchors, env, REPOSITORY, out_dir / "triton.log")
        runs.append(("triton", {f"triton-{mode}": MODELS[mode] for mode in args.modes}))
    records, errors = [], []
    try:
        for name, series in runs:
            errors += run_series(servers[name], series, plan, args.reps, records)
    except KeyboardInterrupt:
        errors.append("interrupted (Ctrl-C)")
    finally:
        end_run(servers, out_dir, records)
    series = aggregate(records)
    text = report(series, records, errors, args, plan)
    if series:
        text += "\n\n" + plot(series, [args.plot, out_dir / "continuous_batching.png"])
    (out_dir / "report.md").write_text(text + "\n")
    print(text)
    print(f"\n(results in {out_dir})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
