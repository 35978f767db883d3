"""Benchmark ensembles on the real Triton and on shmserve, in one run: chains of identity_fp32
steps (`ens_identity2`: 2 steps, `ens_identity4`: 4), FP32 tensors of 16 KiB, 1 MiB and 4 MiB,
gRPC and HTTP, concurrency 1 and 4, perf_analyzer driving both.

    .venv/bin/python perf/bench_ensemble.py [--only triton|shmserve] [--models ens_identity2 ...]
                                            [--sizes-kib 16 1024 4096] [--concurrency 1 4]
                                            [--protocols grpc http]

What differs between the servers is how a step's output reaches the next step: shmserve hands
the next step's worker a reference to the producing instance's output arena, Triton's Python
backend copies each tensor between its stub process and the server. The 4-step chain against
the 2-step one gives the cost of one more step.

Both servers serve perf/triton_repo/ (the same model files), one after the other, never
together. Each is first checked (OUTPUT equals INPUT for every model, protocol and size;
perf_analyzer never looks at outputs), then measured, then stopped by its PID, also on failure.
Prints markdown tables (ratios shmserve / Triton first) and writes everything under
perf/results/ensemble-<date>-<time>/.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pa_runner import measure_server
from servers import (add_server_arguments, new_run, publish, run_metadata, run_servers, serve_and_measure, Server,
                     ServerError, fmt, markdown_row, ratio)

STEPS = {"ens_identity2": 2, "ens_identity4": 4}  # the chains in perf/triton_repo/
STEP_MODEL = "identity_fp32"
PROTOCOLS = {"grpc": grpcclient, "http": httpclient}
FP32_BYTES = 4
KIB = 1024
CHECK_TIMEOUT_S = 60


def elements(kib: int) -> int:
    return kib * KIB // FP32_BYTES


def size_label(kib: int) -> str:
    return f"{kib // KIB} MiB" if kib % KIB == 0 else f"{kib} KiB"


def port_of(server: Server, protocol: str) -> int:
    return server.grpc_port if protocol == "grpc" else server.http_port


def check_chain(server: Server, model: str, protocol: str, kib: int) -> None:
    """One infer of a [1, N] FP32 tensor of random values: OUTPUT must equal INPUT."""
    module = PROTOCOLS[protocol]
    data = np.random.default_rng().standard_normal((1, elements(kib)), dtype=np.float32)
    if module is grpcclient:
        client, kwargs = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"), \
            dict(client_timeout=CHECK_TIMEOUT_S)
    else:
        client, kwargs = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}",
                                                          network_timeout=CHECK_TIMEOUT_S), {}
    try:
        tensor = module.InferInput("INPUT", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        out = client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT")
    except InferenceServerException as e:
        raise ServerError(f"{server.name} {model} {protocol} {size_label(kib)}: infer failed: {e}") from e
    finally:
        client.close()
    if out is None or out.dtype != np.float32 or not np.array_equal(out, data):
        shape = None if out is None else out.shape
        raise ServerError(f"{server.name} {model} {protocol} {size_label(kib)}: OUTPUT (shape {shape}) "
                          "differs from INPUT")


def run_perf_analyzer(server: Server, case, pa, out_dir: Path, measurement_args: list[str]) -> dict:
    model, protocol, kib, concurrency = case
    args = ["-m", model, "-u", f"127.0.0.1:{port_of(server, protocol)}", "-i", protocol,
            "--shape", f"INPUT:{elements(kib)}", "--concurrency-range", f"{concurrency}:{concurrency}"]
    stem = out_dir / "pa" / f"{server.name}_{model}_{protocol}_{kib}KiB_c{concurrency}"
    return measure_server(server.pid, pa, args, stem, measurement_args, retry=False)


def check_and_measure(server: Server, cases, pa, out_dir: Path, measurement_args, records: list[dict],
                      errors: list[str]) -> None:
    """Check every model, protocol and size, then measure the cases of the models that passed,
    appending to records as it goes."""
    usable = set()
    for model in dict.fromkeys(case[0] for case in cases):
        try:
            server.wait_model_ready(model)
            for protocol, kib in dict.fromkeys((p, k) for m, p, k, _ in cases if m == model):
                check_chain(server, model, protocol, kib)
            usable.add(model)
        except ServerError as e:
            errors.append(f"{e} -> {model} not measured on {server.name}")
    for case in cases:
        if case[0] in usable:
            model, protocol, kib, concurrency = case
            records.append(dict(server=server.name, model=model, protocol=protocol, kib=kib, concurrency=concurrency,
                                **run_perf_analyzer(server, case, pa, out_dir, measurement_args)))
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)


def step_stats(rec: dict) -> dict:
    """The composing model's server-side figures (all steps run identity_fp32)."""
    composing = (rec.get("server_stats") or {}).get("composing") or {}
    return next((s for name, s in composing.items() if name.startswith(STEP_MODEL + ",")), {})


def ratio_table(ok: dict, cases) -> str:
    lines = [markdown_row(["model", "protocol", "size", "conc", "infer/s", "p50", "p99"]),
             markdown_row(["---", "---", "---:", "---:", "---:", "---:", "---:"])]
    for case in cases:
        t, s = ok.get(("triton", *case), {}), ok.get(("shmserve", *case), {})
        model, protocol, kib, concurrency = case
        lines.append(markdown_row([model, protocol, size_label(kib), str(concurrency)] + [
            fmt(ratio(s.get(key), t.get(key)), ".2f") for key in ("infer_per_s", "p50_ms", "p99_ms")]))
    return "\n".join(lines)


def ensemble_stat(rec: dict, key: str):
    return (rec.get("server_stats") or {}).get(key)


def step_compute(rec: dict) -> str:
    return "/".join(fmt(step_stats(rec).get(f"compute_{k}_us"), ".0f") for k in ("input", "infer", "output"))


def absolute_table(ok: dict, cases) -> str:
    lines = [markdown_row(["model", "protocol", "size", "conc", "infer/s", "p50 ms", "p99 ms", "server request µs",
                           "ensemble overhead µs", "step request µs", "step batch", "step compute in/infer/out µs",
                           "server CPU cores", "breakdown printed"]),
             markdown_row(["---", "---", "---:", "---:"] + ["---:"] * 9 + ["---"])]
    for case in cases:
        t, s = ok.get(("triton", *case), {}), ok.get(("shmserve", *case), {})

        def pair(get, spec: str, t=t, s=s) -> str:
            return f"{fmt(get(t), spec)} / {fmt(get(s), spec)}"

        model, protocol, kib, concurrency = case
        lines.append(markdown_row([
            model, protocol, size_label(kib), str(concurrency), pair(lambda r: r.get("infer_per_s"), ",.0f"),
            pair(lambda r: r.get("p50_ms"), ".2f"), pair(lambda r: r.get("p99_ms"), ".2f"),
            pair(lambda r: ensemble_stat(r, "request_us"), ".0f"), pair(lambda r: ensemble_stat(r, "overhead_us"), ".0f"),
            pair(lambda r: step_stats(r).get("request_us"), ".0f"),
            pair(lambda r: ratio(step_stats(r).get("inference_count"), step_stats(r).get("execution_count")), ".2f"),
            f"{step_compute(t)} / {step_compute(s)}", pair(lambda r: r.get("server_cpu_cores"), ".2f"),
            " / ".join(("yes" if step_stats(r) else "no") if r else "–" for r in (t, s))]))
    return "\n".join(lines)


def step_cost_table(ok: dict, cases) -> str:
    """The ensemble's server-side request time with the longest chain minus the shortest's, per
    step added: what one more step costs each server, where the handling of the intermediate
    tensors shows (server-side, so without the client and the transport of INPUT and OUTPUT)."""
    short, long = min(STEPS[m] for m, *_ in cases), max(STEPS[m] for m, *_ in cases)
    if short == long:
        return ""
    name = {n: m for m, n in STEPS.items()}
    lines = [f"\n### One more step: (server request of {name[long]} - of {name[short]}) / {long - short}, µs "
             "(T = Triton, S = shmserve)\n",
             markdown_row(["protocol", "size", "conc", "T", "S", "S / T"]),
             markdown_row(["---", "---:", "---:", "---:", "---:", "---:"])]
    for _, protocol, kib, concurrency in dict.fromkeys((None, *case[1:]) for case in cases):
        cost = {}
        for server in ("triton", "shmserve"):
            requests = [ensemble_stat(ok.get((server, name[n], protocol, kib, concurrency), {}), "request_us")
                        for n in (long, short)]
            cost[server] = None if None in requests else (requests[0] - requests[1]) / (long - short)
        lines.append(markdown_row([protocol, size_label(kib), str(concurrency), fmt(cost["triton"], ",.0f"),
                                   fmt(cost["shmserve"], ",.0f"), fmt(ratio(cost["shmserve"], cost["triton"]), ".2f")]))
    return "\n".join(lines)


def report(records: list[dict], cases, args, elapsed_s: float) -> str:
    ok = {(r["server"], r["model"], r["protocol"], r["kib"], r["concurrency"]): r for r in records if r["error"] is None}
    parts = ["### Ratios shmserve / Triton (infer/s: above 1 is better; p50, p99: below 1 is better)\n",
             ratio_table(ok, cases),
             "\n### perf_analyzer (each cell: Triton / shmserve)\n",
             absolute_table(ok, cases),
             f"\nserver request = the ensemble's average server-side request time, ensemble overhead = the part "
             "of it outside its steps' queue and compute times (perf_analyzer's figure); step request, step batch "
             f"(inference count / execution count) and step compute input/infer/output = the composing model "
             f"{STEP_MODEL}'s server-side figures, per step request, as perf_analyzer printed them in its "
             "\"Composing models\" section (breakdown printed: whether it did). Server CPU = the server's "
             "process tree over the whole perf_analyzer run.",
             step_cost_table(ok, cases),
             f"\nperf_analyzer {' '.join(args.measurement_args)} (no retry), `--shape INPUT:N` (FP32 "
             f"[1, N]); {STEP_MODEL}: dynamic batching, max_batch_size 64, one CPU instance. "
             f"Run time {elapsed_s / 60:.1f} min."]
    return "\n".join(part for part in parts if part)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=tuple(STEPS), default=list(STEPS))
    ap.add_argument("--sizes-kib", type=int, nargs="+", default=[16, 1024, 4096],
                    help="input sizes in KiB, multiples of 4 (default 16 1024 4096)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--protocols", nargs="+", choices=tuple(PROTOCOLS), default=list(PROTOCOLS))
    # Short windows and a 20 % stability tolerance from the start (no retry) keep the whole run
    # under 10 minutes on a small machine.
    ap.add_argument("--window-ms", type=int, default=1500, help="perf_analyzer's window (-p), default 1500")
    ap.add_argument("--max-trials", type=int, default=10, help="perf_analyzer's --max-trials, default 10")
    ap.add_argument("--stability", type=int, default=20, help="perf_analyzer's -s (percent), default 20")
    add_server_arguments(ap)
    args = ap.parse_args()
    args.measurement_args = ["-p", str(args.window_ms), "--max-trials", str(args.max_trials), "-s", str(args.stability)]
    return args


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    env, out_dir, servers, names = new_run(args, "ensemble")
    cases = [(m, p, k, c) for m in args.models for p in args.protocols for k in args.sizes_kib for c in args.concurrency]
    pa = (env["PERF_ANALYZER"], env["PA_LD"])
    (out_dir / "meta.json").write_text(json.dumps(run_metadata(args, env, models=args.models), indent=1, default=str))

    records = []
    errors = run_servers(servers, names, out_dir, records, lambda server: serve_and_measure(
        server, lambda errs: check_and_measure(server, cases, pa, out_dir, args.measurement_args, records, errs)))
    errors += [f"{r['server']} {r['model']} {r['protocol']} {size_label(r['kib'])} c={r['concurrency']}: {r['error']}"
               for r in records if r["error"]]
    errors += [f"{r['server']} {r['model']} {r['protocol']} {size_label(r['kib'])} c={r['concurrency']}: perf_analyzer "
               "printed no complete server-side breakdown with the composing models"
               for r in records if r["error"] is None and not step_stats(r)]
    return publish(out_dir, report(records, cases, args, time.monotonic() - started), errors)


if __name__ == "__main__":
    sys.exit(main())
