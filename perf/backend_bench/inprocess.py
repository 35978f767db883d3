"""The in-process limit: onnxruntime alone, in a loop, in a child process (perf/ort_inprocess.py)
run by shmserve's interpreter so that it has the worker's onnxruntime; the limit at a server's
average batch size (limit_at); and the session options shmserve's backend builds from a config,
to check that both run the same session."""
import bisect
import json
import subprocess
import sys
from pathlib import Path

from servers import PERF_DIR, REPO_ROOT, ServerError, ShmServer
from .models import MAX_BATCH, Model

INPROCESS = PERF_DIR / "ort_inprocess.py"


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

