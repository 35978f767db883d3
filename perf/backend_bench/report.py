"""The benchmark's report: the issue's targets with a verdict each (target_rows), then the
perf_analyzer, in-process and memory tables, from the run's records (Results)."""
import os

from servers import SERVER_NAMES, fmt, markdown_row, ratio
from .inprocess import limit_at
from .models import HEAVY_HIDDEN, HEAVY_WIDTH, MAX_BATCH, TINY_COLS, Model

MB = 1e6

# The issue's targets.
TARGET_LIMIT_RATIO = 0.9      # heavy, concurrency 8: shmserve infer/s / in-process at its batch size
TARGET_ADDED_P50_US = 150     # tiny, concurrency 1: shmserve p50 - in-process p50 of one batch-1 run
TARGET_TINY_VS_TRITON = 1.5   # tiny: shmserve infer/s / Triton's
TARGET_HEAVY_VS_TRITON = 1.0  # heavy: the same
TARGET_P99_VS_TRITON = 1.0    # both: p99 no worse than Triton's
TARGET_RSS_MB = 40            # tiny's worker VmRSS - the plain process's, MB


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
