"""Instructions per request, counted by valgrind (callgrind), of one build or of two side by
side: a figure the machine's load does not move, for telling a change of a few percent on the
request path from this VM's noise.

    .venv/bin/python perf/instructions_per_request.py [--build DIR ...] [--protocol grpc|http]
        [--requests 100 1100] [--workers]

Each build (a checkout: this one by default; an older commit with `git worktree add --detach
DIR <commit>`) serves model_repository/identity_fp32 with its front under callgrind (and its
workers too with --workers), with the front's and the workers' polling off (their instructions
would follow the wall clock, not the requests); one tritonclient client sends [1,16] FP32
requests one at a time, first 50 to warm the path, then N. The run is made for each N of
--requests, and the figure is the difference of the totals divided by the difference of the Ns,
so that start-up and shutdown cancel out. Valgrind must be installed (`apt-get install
valgrind`); a run takes a minute or two (the front runs some 50 times slower under it).
"""
import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from servers import REPO_ROOT, free_port

CLIENT = """
import sys
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
lib = grpcclient if sys.argv[1] == "grpc" else httpclient
client = lib.InferenceServerClient(sys.argv[2])
tensor = lib.InferInput("INPUT0", [1, 16], "FP32")
tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
for _ in range(int(sys.argv[3])):
    client.infer("identity_fp32", [tensor])
client.close()
"""


def total_instructions(build: Path, protocol: str, requests: int, workers: bool,
                       scratch: Path) -> int:
    """Instructions of the server's processes (the front, or every one with `workers`) over a
    run of `requests` requests after the warm-up."""
    repo = scratch / "repo"
    if not repo.exists():
        repo.mkdir()
        (repo / "identity_fp32").symlink_to(REPO_ROOT / "model_repository" / "identity_fp32")
    ports = [free_port() for _ in range(3)]
    out = scratch / f"{build.name}-{protocol}-{requests}"
    cmd = ["valgrind", "--tool=callgrind", f"--trace-children={'yes' if workers else 'no'}",
           f"--callgrind-out-file={out}.%p.out", sys.executable, "-m", "shmserve.cli",
           "--model-repository", str(repo), "--http-address", "127.0.0.1",
           "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
           "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
           "--metrics-port", str(ports[2]), "--worker-spin-us=0", "--front-spin-us=0",
           "--allow-metrics=false"]
    env = dict(os.environ, PYTHONPATH=str(build))
    with open(f"{out}.log", "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=build, env=env)
    try:
        ready = f"http://127.0.0.1:{ports[0]}/v2/models/identity_fp32/ready"
        deadline = time.monotonic() + 900
        while True:
            try:
                urllib.request.urlopen(ready, timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start: see {out}.log") from None
                time.sleep(1)
        url = f"127.0.0.1:{ports[1] if protocol == 'grpc' else ports[0]}"
        for count in (50, requests):
            subprocess.run([sys.executable, "-c", CLIENT, protocol, url, str(count)], check=True)
    finally:
        server.send_signal(signal.SIGTERM)  # the server this script started, by its pid
        server.wait()
    total = 0
    for path in glob.glob(f"{out}.*.out"):
        with open(path) as f:
            for line in f:
                if line.startswith("summary:"):
                    total += int(line.split()[1])
        os.unlink(path)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", type=Path,
                    help="a checkout to measure (repeatable; default: this one)")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    ap.add_argument("--requests", type=int, nargs=2, default=(100, 1100), metavar=("N1", "N2"))
    ap.add_argument("--workers", action="store_true",
                    help="count the workers' instructions too (slower)")
    args = ap.parse_args()
    builds = args.build or [REPO_ROOT]
    n1, n2 = args.requests
    with tempfile.TemporaryDirectory(prefix="instructions_") as scratch:
        for build in builds:
            build = build.resolve()
            low, high = (total_instructions(build, args.protocol, n, args.workers, Path(scratch))
                         for n in (n1, n2))
            print(f"{build}: {args.protocol}, {(high - low) / (n2 - n1):,.0f} instructions per "
                  f"request ({'front and workers' if args.workers else 'front'}); "
                  f"{low:,} in all for {n1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
