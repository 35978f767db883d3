"""One soak run: the server started, the client threads let loose until the time is up with a
sample every --sample-s (two of them quiescent: after the warm-up and at the end), the server
stopped, and the verdict: every failure, lost request, miscount, log error, growth or leftover
is an error, and any error makes the exit status 1."""
import argparse
import json
import os
import signal
import sys
import threading
import time

from servers import PERF_DIR, REPO_ROOT, ServerError, ShmServer, publish
from .clients import TIMEOUT_S
from .report import log_levels, report, sample_line
from .samples import our_regions, sample, worker_labels
from .tally import Tally, server_successes
from .traffic import Gate, make_clients, run_client


def quiescent(gate: Gate, server, labels, started, tag, errors) -> dict:
    """A sample with every client held between two units and the server given a second to settle."""
    if not gate.hold():
        errors.append(f"{tag}: the clients did not come to a halt within {TIMEOUT_S} s")
    time.sleep(1)
    return sample(server, labels, started, tag)


def soak(args, server: ShmServer, out_dir, errors: list[str]) -> tuple:
    tally = Tally()
    clients = make_clients(tally, tuple(args.ports))
    labels = worker_labels(server.pid)
    started = time.monotonic()
    samples = [sample(server, labels, started, "start (idle)")]
    gate = Gate(len(clients))
    threads = [threading.Thread(target=run_client, args=(c, gate, i), name=c.name, daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    deadline = started + args.minutes * 60
    warm = None
    try:
        while (now := time.monotonic()) < deadline:
            time.sleep(min(args.sample_s, deadline - now))
            if warm is None and time.monotonic() - started >= args.warmup_s:
                warm = quiescent(gate, server, labels, started, "warm (held)", errors)
                samples.append(warm)
                gate.release()
            else:
                samples.append(sample(server, labels, started, "load"))
            print(sample_line(samples[-1]), file=sys.stderr, flush=True)
        end = quiescent(gate, server, labels, started, "end (held)", errors)
        samples.append(end)
    finally:
        gate.release("stop")
        for t in threads:
            t.join(TIMEOUT_S)
            if t.is_alive():
                errors.append(f"client {t.name} did not end")
    if warm is None:
        errors.append(f"the run was shorter than the warm-up ({args.warmup_s} s): no growth measured")
        warm = samples[0]
    with open(out_dir / "samples.jsonl", "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples)
    return tally, samples, warm, end


def parse_args(doc: str):
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--warmup-s", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--ports", type=int, nargs=3, default=[18120, 18121, 18122], metavar=("HTTP", "GRPC", "METRICS"))
    return ap.parse_args()


def main(doc: str) -> int:
    """soak.py's command line; `doc` is that script's docstring, whose first line --help prints."""
    args = parse_args(doc)
    out_dir = PERF_DIR / "results" / time.strftime("soak-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    server = ShmServer(REPO_ROOT / "model_repository", tuple(args.ports), out_dir / "shmserve.log")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    errors: list[str] = []
    text, server_pid = "", None
    try:
        server.start()
        tally, samples, warm, end = soak(args, server, out_dir, errors)
        if tally.errors:
            errors.append(f"{sum(tally.errors.values())} failed or wrong answers; first: {tally.first_errors}")
        if sum(tally.sent.values()) != sum(tally.served.values()):
            errors.append("requests lost")
        if sum(end["metrics"]["failure"].values()):
            errors.append(f"server-side failures: {end['metrics']['failure']}")
        counted, expected = sum(end["metrics"]["success"].values()), server_successes(tally)
        if counted != expected:
            errors.append(f"the server counts {counted} successes, the clients expect {expected}")
        log_lines = log_levels(server.log_path)
        if log_lines["E"]:
            errors.append(f"{log_lines['E']} error lines in {server.log_path}")
        text = report(args, tally, samples, warm, end, errors, log_lines)
    except (ServerError, OSError) as e:
        errors.append(f"shmserve: {e}")
    except KeyboardInterrupt:
        errors.append("interrupted (Ctrl-C)")
    finally:
        server_pid = server.pid
        leftovers = server.stop()
    if leftovers:
        errors.append(f"processes {leftovers} outlived the server (killed)")
    left = our_regions() + [n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve.{server_pid}.")]
    if left:
        errors.append(f"left in /dev/shm: {left}")
    return publish(out_dir, text, errors)
