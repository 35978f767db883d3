"""The anchors' Triton, which other sessions share: the lock they all take for as long as their
Triton lives, and whether the anchors' venv, which Triton's Python stubs run, has onnxruntime."""
import fcntl
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

TRITON_LOCK = Path("/tmp/anchor-triton.lock")


@contextmanager
def anchor_triton_lock():
    """The anchors' Triton is shared with other sessions: hold the lock they take for as long as
    this run's Triton lives."""
    with open(TRITON_LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {TRITON_LOCK} (another session uses the anchors' Triton)",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def triton_onnxruntime(env: dict[str, str]) -> tuple[str | None, str]:
    """(onnxruntime's version in the anchors' Triton venv or None, what its python said)."""
    python = Path(env["TRITON_VENV"]) / "bin" / "python"
    code = "import numpy, onnxruntime; print(onnxruntime.__version__, numpy.__version__)"
    p = subprocess.run([str(python), "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else f"exit {p.returncode}"
    ort_version, numpy_version = p.stdout.split()
    return ort_version, f"onnxruntime {ort_version}, numpy {numpy_version}"

