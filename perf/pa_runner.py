"""One perf_analyzer measurement: run it with a CSV report (-f), read throughput and latency."""
import csv
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Same settings as the anchors: 3 s windows, up to 20 of them until 3 in a row agree within 10 %.
MEASUREMENT_ARGS = ["-p", "3000", "--max-trials", "20"]
PA_TIMEOUT_S = 300


@dataclass
class Measurement:
    infer_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    avg_ms: float | None = None
    error: str | None = None
    retried_with_s20: bool = False


def parse_csv(path: Path) -> Measurement:
    """perf_analyzer's -f CSV: a header row then one row per concurrency, latencies in µs
    (columns "Concurrency", "Inferences/Second", "p50 latency", "p99 latency", "Avg latency")."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(line for line in f if line.strip())
                if (r.get("Concurrency") or "").strip().isdigit()]
    if not rows:
        return Measurement(error=f"no result row in {path.name}")
    row = rows[-1]
    us = lambda key: float(row[key]) / 1000.0
    return Measurement(infer_per_s=float(row["Inferences/Second"]), p50_ms=us("p50 latency"),
                       p99_ms=us("p99 latency"), avg_ms=us("Avg latency"))


def _run_once(perf_analyzer: str, ld_path: str, args: list[str], out_stem: Path) -> tuple[int, str, Measurement | None]:
    csv_path = out_stem.with_suffix(".csv")
    csv_path.unlink(missing_ok=True)
    cmd = [perf_analyzer, *args, "-f", str(csv_path), "--verbose-csv"]
    try:
        p = subprocess.run(cmd, env=dict(os.environ, LD_LIBRARY_PATH=ld_path),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=PA_TIMEOUT_S)
        rc, output = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, output = 124, (e.stdout or b"").decode(errors="replace") + f"\n[killed after {PA_TIMEOUT_S} s]"
    out_stem.with_suffix(".log").write_text("$ " + " ".join(cmd) + "\n" + output)
    result = parse_csv(csv_path) if rc == 0 and csv_path.exists() else None
    return rc, output, result


def measure(perf_analyzer: str, ld_path: str, args: list[str], out_stem: Path) -> Measurement:
    """Run perf_analyzer with args + MEASUREMENT_ARGS; on a stability failure retry once with
    -s 20 (20 % tolerance), as the anchors did. Raw output goes to out_stem.{log,csv}."""
    rc, output, result = _run_once(perf_analyzer, ld_path, args + MEASUREMENT_ARGS, out_stem)
    if result is None and "stable" in output.lower():
        stem = out_stem.with_name(out_stem.name + "_s20")
        rc, output, result = _run_once(perf_analyzer, ld_path, args + MEASUREMENT_ARGS + ["-s", "20"], stem)
        if result is not None:
            result.retried_with_s20 = True
    if result is None:
        tail = " | ".join(line.strip() for line in output.splitlines() if line.strip())[-400:]
        result = Measurement(error=f"rc={rc}: {tail}")
    return result
