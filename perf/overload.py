"""A bounded overload: shmserve under offered load several times its capacity, then normal load.

    .venv/bin/python perf/overload.py [--exec-ms 20] [--factor 5] [--seconds 10]
                                      [--queue N] [--protocol http]

Serves the test model `slow` (default scheduler, 2 instances, each request sleeps --exec-ms),
so capacity is 2000 / exec-ms requests a second. Load is open-loop (requests leave at a fixed
rate whatever the answers, as independent clients would send them): half capacity for a
baseline, --factor x capacity for --seconds, then half capacity again for twice as long.
`--queue` is passed as --max-queue-size-default (0: unbounded, as Triton; left out: the
server's default). Prints, per phase: offered requests, shed rate (UNAVAILABLE "Exceeds maximum
queue size"), latency p50/p99 of accepted and of shed requests, the most RSS the server and
its workers had, and when latency came back to the baseline's.
"""

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import aiohttp
import numpy as np

from servers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHED = "Exceeds maximum queue size"
IN_FLIGHT_CAP = 20000  # the generator's own safety bound


def tree_rss_mib(pid: int) -> float:
    """RSS of a process and its children, MiB."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except (OSError, StopIteration):
            pass
    return total / 1024


class Phase:
    def __init__(self, name: str):
        self.name = name
        self.accepted: list = []  # (start time, latency s)
        self.shed: list = []
        self.other: list = []
        self.max_rss = 0.0


def pct(values, q) -> str:
    return f"{np.percentile(values, q) * 1000:8.1f}" if values else "       -"


async def run(args, http_url: str, pid: int) -> list:
    capacity = 2000.0 / args.exec_ms
    body = ('{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[%f]}]}'
            % (args.exec_ms / 1000)).encode()
    phases = [(Phase("before"), 0.5, args.seconds / 2),
              (Phase("overload"), args.factor, args.seconds),
              (Phase("after"), 0.5, args.seconds * 2)]
    in_flight = set()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def one(phase: Phase):
            start = time.monotonic()
            try:
                async with session.post(f"http://{http_url}/v2/models/slow/infer",
                                        data=body) as resp:
                    text = await resp.text()
                    status = resp.status
            except aiohttp.ClientError as exc:
                phase.other.append(repr(exc))
                return
            took = time.monotonic() - start
            if status == 200:
                phase.accepted.append((start, took))
            elif status == 503 and SHED in text:
                phase.shed.append((start, took))
            else:
                phase.other.append(f"{status} {text[:100]}")

        async def sample_rss(phase: Phase, until: float):
            while time.monotonic() < until:
                phase.max_rss = max(phase.max_rss, tree_rss_mib(pid))
                await asyncio.sleep(0.25)

        for phase, factor, seconds in phases:
            rate = capacity * factor
            begin = time.monotonic()
            sampler = asyncio.ensure_future(sample_rss(phase, begin + seconds))
            sent = 0
            while (now := time.monotonic()) < begin + seconds:
                due = int((now - begin) * rate)
                while sent < due and len(in_flight) < IN_FLIGHT_CAP:
                    task = asyncio.ensure_future(one(phase))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    sent += 1
                await asyncio.sleep(0.002)
            await sampler
        await asyncio.gather(*in_flight)
    return [p for p, _, _ in phases]


def report(args, phases: list, rss_idle: float) -> None:
    capacity = 2000.0 / args.exec_ms
    print(f"\nmodel 'slow': 2 instances x {args.exec_ms} ms = {capacity:.0f} req/s capacity; "
          f"overload {args.factor}x for {args.seconds} s; "
          f"--max-queue-size-default={args.queue if args.queue is not None else '(default)'}")
    print(f"server + workers RSS idle: {rss_idle:.0f} MiB")
    print(f"{'phase':9} {'offered':>8} {'shed %':>7} {'acc p50':>8} {'acc p99':>8} "
          f"{'shed p50':>8} {'shed p99':>8} {'errors':>6} {'max RSS':>8}   (ms, MiB)")
    for p in phases:
        offered = len(p.accepted) + len(p.shed) + len(p.other)
        acc = [t for _, t in p.accepted]
        shed = [t for _, t in p.shed]
        print(f"{p.name:9} {offered:8d} {100 * len(shed) / max(offered, 1):7.1f} "
              f"{pct(acc, 50)} {pct(acc, 99)} {pct(shed, 50)} {pct(shed, 99)} "
              f"{len(p.other):6d} {p.max_rss:8.0f}")
    before = phases[0]
    after = phases[2]
    base = np.percentile([t for _, t in before.accepted], 50) if before.accepted else 0
    begin = min((s for s, _ in after.accepted), default=0)
    # 1-second windows of the after phase: recovered from the first one whose median, and
    # every later one's, is within 2x the baseline's.
    windows: dict = {}
    for start, took in after.accepted:
        windows.setdefault(int(start - begin), []).append(took)
    medians = [np.percentile(windows[w], 50) if w in windows else 0.0
               for w in range(max(windows, default=-1) + 1)]
    back = len(medians)
    while back > 0 and medians[back - 1] <= 2 * base:
        back -= 1
    if back < len(medians):
        print(f"after the overload, the median latency of accepted requests is back within "
              f"2x the baseline's ({base * 1000:.1f} ms) after {back} s")
    else:
        print(f"after the overload, the median latency of accepted requests is still above "
              f"2x the baseline's ({base * 1000:.1f} ms) after {len(medians)} s")
    errors = [e for p in phases for e in p.other][:3]
    if errors:
        print("first errors:", errors)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exec-ms", type=float, default=20.0)
    ap.add_argument("--factor", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--queue", type=int, default=None,
                    help="--max-queue-size-default for the server (0: unbounded)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        os.mkdir(repo)
        os.symlink(os.path.join(ROOT, "tests", "models", "slow"), os.path.join(repo, "slow"))
        http_port = free_port()
        cmd = [sys.executable, "-m", "shmserve.cli", "--model-repository", repo,
               "--http-address", "127.0.0.1", "--http-port", str(http_port),
               "--allow-grpc=false", "--allow-metrics=false"]
        if args.queue is not None:
            cmd.append(f"--max-queue-size-default={args.queue}")
        with open(os.path.join(tmp, "server.log"), "wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"127.0.0.1:{http_port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://{url}/v2/models/slow/ready", timeout=1)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        print(open(os.path.join(tmp, "server.log")).read())
                        return 1
                    time.sleep(0.1)
            rss_idle = tree_rss_mib(proc.pid)
            phases = asyncio.run(run(args, url, proc.pid))
            report(args, phases, rss_idle)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
