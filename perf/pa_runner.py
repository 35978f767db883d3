"""One perf_analyzer measurement: run it with a CSV report (-f), read throughput and latency, and
the server-side statistics it printed (read from the server's statistics extension)."""
import csv
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from servers import tree_cpu_seconds

# Same settings as the anchors: 3 s windows, up to 20 of them until 3 in a row agree within 10 %.
MEASUREMENT_ARGS = ["-p", "3000", "--max-trials", "20"]
PA_TIMEOUT_S = 300


@dataclass
class RequestStats:
    """What perf_analyzer's "Server:" section gives of any model, over the measured windows;
    latencies are averages in µs."""
    inference_count: int
    execution_count: int
    success_count: int
    request_us: int
    overhead_us: int
    queue_us: int


@dataclass
class ServerStats(RequestStats):
    """The "Server:" section of a model that is not an ensemble."""
    compute_input_us: int
    compute_infer_us: int
    compute_output_us: int


@dataclass
class EnsembleStats(RequestStats):
    """The "Server:" section of an ensemble: its own figures (a single compute time), then each
    composing model's section."""
    compute_us: int
    composing: dict  # "model, version: N" -> ServerStats as a dict


@dataclass
class Measurement:
    infer_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    avg_ms: float | None = None
    error: str | None = None
    retried_with_s20: bool = False
    # a ServerStats (an EnsembleStats for an ensemble) as a dict; None when perf_analyzer printed none
    server_stats: dict | None = None


_SERVER_COUNTS = {"inference_count": r"Inference count: (\d+)", "execution_count": r"Execution count: (\d+)",
                  "success_count": r"Successful request count: (\d+)"}
_SERVER_LATENCY = re.compile(
    r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input (\d+) usec "
    r"\+ compute infer (\d+) usec \+ compute output (\d+) usec\)")


_ENSEMBLE_LATENCY = re.compile(
    r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute (\d+) usec\)")
_COMPOSING_MODEL = re.compile(r"^\s*(\S+), version: (\S+)\s*$", re.MULTILINE)


def _server_section(output: str) -> str | None:
    start = output.rfind("Server:")
    return None if start < 0 else output[start:]


def _counts(section: str) -> dict | None:
    found = {key: re.search(pattern, section) for key, pattern in _SERVER_COUNTS.items()}
    return None if None in found.values() else {key: int(m.group(1)) for key, m in found.items()}


def parse_server_stats(output: str) -> ServerStats | None:
    """The last "Server:" section of perf_analyzer's output, if it is complete and not an
    ensemble's (see parse_ensemble_stats):
        Server:
          Inference count: 95174
          Execution count: 95174
          Successful request count: 95174
          Avg request latency: 3503 usec (overhead 1 usec + queue 3389 usec + compute input 7 usec + ...)"""
    section = _server_section(output)
    if section is None or "Composing models:" in section:
        return None
    return _single_model_stats(section)


def _single_model_stats(section: str) -> ServerStats | None:
    counts = _counts(section)
    latency = _SERVER_LATENCY.search(section)
    if latency is None or counts is None:
        return None
    request, overhead, queue, c_input, c_infer, c_output = (int(g) for g in latency.groups())
    return ServerStats(**counts, request_us=request, overhead_us=overhead, queue_us=queue,
                       compute_input_us=c_input, compute_infer_us=c_infer, compute_output_us=c_output)


def parse_ensemble_stats(output: str) -> EnsembleStats | None:
    """The last "Server:" section when it is an ensemble's, if it is complete:
        Server:
          Inference count: 1000
          ...
          Avg request latency: 900 usec (overhead 100 usec + queue 200 usec + compute 600 usec)

        Composing models:
        identity_fp32, version: 1
            Inference count: 2000
            ... (as in parse_server_stats)"""
    section = _server_section(output)
    if section is None or "Composing models:" not in section:
        return None
    own, composing_text = section.split("Composing models:", 1)
    counts, latency = _counts(own), _ENSEMBLE_LATENCY.search(own)
    if counts is None or latency is None:
        return None
    headers = list(_COMPOSING_MODEL.finditer(composing_text))
    composing = {}
    for header, following in zip(headers, headers[1:] + [None]):
        stats = _single_model_stats(composing_text[header.end():following.start() if following else None])
        if stats is None:
            return None
        composing[f"{header.group(1)}, version: {header.group(2)}"] = asdict(stats)
    if not composing:
        return None
    request, overhead, queue, compute = (int(g) for g in latency.groups())
    return EnsembleStats(**counts, request_us=request, overhead_us=overhead, queue_us=queue, compute_us=compute,
                         composing=composing)


def parse_csv(path: Path) -> Measurement:
    """perf_analyzer's -f CSV: a header row then one row per concurrency, latencies in µs
    (columns "Concurrency", "Inferences/Second", "p50 latency", "p99 latency", "Avg latency")."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(line for line in f if line.strip())
                if (r.get("Concurrency") or "").strip().isdigit()]
    if not rows:
        return Measurement(error=f"no result row in {path.name}")
    row = rows[-1]

    def us(key):
        return float(row[key]) / 1000.0

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
    if result is not None:
        stats = parse_server_stats(output) or parse_ensemble_stats(output)
        result.server_stats = None if stats is None else asdict(stats)
    return rc, output, result


def measure(perf_analyzer: str, ld_path: str, args: list[str], out_stem: Path,
            measurement_args: list[str] = MEASUREMENT_ARGS, retry: bool = True) -> Measurement:
    """Run perf_analyzer with args + measurement_args; on a stability failure retry once with
    -s 20 (20 % tolerance), as the anchors did, unless retry is False (measurement_args that
    set -s themselves). Raw output goes to out_stem.{log,csv}. A result without server_stats
    means perf_analyzer printed no (complete) server-side section."""
    rc, output, result = _run_once(perf_analyzer, ld_path, args + measurement_args, out_stem)
    if retry and result is None and "stable" in output.lower():
        stem = out_stem.with_name(out_stem.name + "_s20")
        rc, output, result = _run_once(perf_analyzer, ld_path, args + measurement_args + ["-s", "20"], stem)
        if result is not None:
            result.retried_with_s20 = True
    if result is None:
        tail = " | ".join(line.strip() for line in output.splitlines() if line.strip())[-400:]
        result = Measurement(error=f"rc={rc}: {tail}")
    return result


def measure_server(server_pid: int, pa: tuple[str, str], args: list[str], out_stem: Path,
                   measurement_args: list[str] = MEASUREMENT_ARGS, retry: bool = True) -> dict:
    """measure() against the server of PID server_pid, as a record: the Measurement's fields, the
    server's CPU use over the run in cores (its process tree), the average server batch
    (inference count / execution count) and the run's wall time."""
    cpu0, t0 = tree_cpu_seconds(server_pid), time.monotonic()
    m = measure(*pa, args, out_stem, measurement_args, retry)
    wall = time.monotonic() - t0
    stats = m.server_stats
    avg_batch = stats["inference_count"] / stats["execution_count"] if stats and stats["execution_count"] else None
    return dict(server_cpu_cores=round((tree_cpu_seconds(server_pid) - cpu0) / wall, 3), avg_batch=avg_batch,
                wall_s=round(wall, 1), **vars(m))
