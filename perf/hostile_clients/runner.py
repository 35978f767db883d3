"""One run of hostile.py: the command line, each case against each server (the probe and the
memory watched from before its first byte until after its connections closed), and the
results written to <out>/<date>-hostile.json and .md."""
import argparse
import asyncio
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from servers import (PERF_DIR, REPO_ROOT, SERVER_NAMES, ServerError, ShmServer, TritonServer,
                     add_server_arguments, anchors_env, rss_kib)
from .case import Case, Ctx
from .catalogue import CASES
from .managed import Managed, alive, healthy
from .memory import RssWatch, reset_hwm, status_kib
from .payloads import MODEL, gzip_bomb
from .probe import PROBE_TIMEOUT_S, Probe, STALL_MS, probe_figures
from .report import GROWTH_MIB, mib_text, summary, table


RETAIN_WAIT_S = 3.0     # retained RSS: VmRSS this long after the attack's connections closed
AFTERMATH_S = 1.0       # the probe's window goes on this long after they closed


async def run_case(case: Case, managed: Managed, args) -> dict:
    server = managed.server
    record: dict = dict(case=case.name, server=server.name)
    probe = Probe(server)
    try:
        error = probe.wait_ready()
        if error:
            record["probe_not_ready"] = error
            probe.terminate()
            managed.restart()
            probe = Probe(server)
            if probe.wait_ready():
                raise ServerError(f"{server.name} does not answer the probe before {case.name}: {error}")
        await asyncio.sleep(0.5)   # the probe's baseline
        pid = server.pid
        rss_before = rss_kib(pid)
        reset_hwm(pid)
        loop = asyncio.get_running_loop()
        ctx = Ctx(server, case.budget_s)
        task = asyncio.ensure_future(case.run(ctx))
        watch = RssWatch(pid, args.rss_limit_mib * 1024, lambda: loop.call_soon_threadsafe(task.cancel))
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        if case.raise_nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile[1], nofile[1]))
        watch.start()
        t_start = time.monotonic()
        try:
            done, _ = await asyncio.wait({task}, timeout=case.budget_s + 10)
            if task not in done:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                answer = f"stopped by the benchmark after {case.budget_s + 10:.0f} s; {ctx.summary()}"
            elif task.cancelled():
                answer = (f"stopped by the benchmark: server RSS passed {args.rss_limit_mib} MiB at "
                          f"{watch.tripped_at:.1f} s; {ctx.summary()}")
            elif task.exception() is not None:
                e = task.exception()
                if isinstance(e, (OSError, asyncio.TimeoutError)):
                    answer = f"attack failed: {type(e).__name__} {e}; {ctx.summary()}"
                else:   # a bug of the benchmark's: said, and the run goes on
                    traceback.print_exception(e)
                    record["benchmark_error"] = repr(e)
                    answer = f"BENCHMARK ERROR {e!r}"
            else:
                answer = task.result()
        finally:
            ctx.close_all()
            await asyncio.sleep(0)
            t_end = time.monotonic()
            if case.raise_nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
        # The aftermath: the probe and the RSS sampler go on for AFTERMATH_S, as a server may
        # still be busy with what the attack left it (a message to inflate, answers to drop).
        await asyncio.sleep(AFTERMATH_S)
        watch.stop()
        probe.stop()
        hwm = peak = None
        try:
            hwm = status_kib(pid, "VmHWM")
            peak = max(hwm, watch.max_kib)
        except (OSError, StopIteration):
            pass
        await asyncio.sleep(max(0.0, t_end + RETAIN_WAIT_S - time.monotonic()))
        try:
            rss_after = rss_kib(pid)
        except (OSError, StopIteration):
            rss_after = None
        samples = probe.collect()
    finally:
        probe.terminate()
    died = not alive(server)
    hung = not died and not healthy(server)
    record.update(
        answer=answer, attack_s=round(t_end - t_start, 1),
        probe=probe_figures(samples, t_start, t_end + AFTERMATH_S),
        probe_baseline=probe_figures(samples, t_start - 0.5, t_start - 1e-6),
        rss_before_mib=round(rss_before / 1024, 1),
        peak_growth_mib=round((peak - rss_before) / 1024, 1) if peak is not None else None,
        retained_mib=round((rss_after - rss_before) / 1024, 1) if rss_after is not None else None,
        vm_hwm_mib=round(hwm / 1024, 1) if hwm is not None else None,
        rss_limit_hit_s=round(watch.tripped_at, 1) if watch.tripped_at is not None else None,
        died=died, hung=hung, details=ctx.details)
    if died or hung or (record["retained_mib"] or 0) > 1024:
        record["restarted"] = "died" if died else "hung" if hung else "retained over 1 GiB"
        managed.restart()
    return record


async def run_server(managed: Managed, cases: list[Case], args) -> list[dict]:
    records = []
    for case in cases:
        print(f"{managed.server.name}: {case.name} ...", end="", file=sys.stderr, flush=True)
        record = await run_case(case, managed, args)
        records.append(record)
        p = record["probe"]
        print(f" {record['answer'][:100]} | probe max {p['max_ms']} ms | peak {mib_text(record['peak_growth_mib'])} MiB"
              f" | retained {mib_text(record['retained_mib'])} MiB" + (" | DIED" if record["died"] else "")
              + (" | HUNG" if record["hung"] else ""), file=sys.stderr, flush=True)
    return records


def out_path(out_dir: Path) -> Path:
    """<out>/<date>-hostile.json, or -2, -3 ... when that day already has one."""
    stem = time.strftime("%Y-%m-%d") + "-hostile"
    path, n = out_dir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = out_dir / f"{stem}-{n}.json"
    return path


def shm_ours(pids: set[int]) -> list[str]:
    """/dev/shm segments named after one of our shmserve PIDs."""
    found = []
    for name in os.listdir("/dev/shm"):
        parts = name.split(".")
        if name.startswith("shmserve.") and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids:
            found.append(name)
    return found


def main(doc: str) -> int:
    """hostile.py's command line; `doc` is that script's docstring, whose first line --help
    prints."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(ap)
    ap.add_argument("--servers", nargs="+", choices=SERVER_NAMES,
                    help="the servers to attack, in this order (default: both; shmserve alone when the "
                         "anchors are missing)")
    ap.add_argument("--cases", help="comma-separated case names (default: all); see --list")
    ap.add_argument("--quick", action="store_true",
                    help="skip the cases that wait 40 s (idle_one_byte, idle_after_settings, http_stalled_body), "
                         "unless --cases names them")
    ap.add_argument("--list", action="store_true", help="print the cases and what each sends, and exit")
    ap.add_argument("--out", type=Path, default=PERF_DIR / "results",
                    help="where the JSON, the table and the servers' logs go (default perf/results)")
    ap.add_argument("--rss-limit-mib", type=int, default=6144,
                    help="stop an attack when the server's RSS passes this (a safety for the machine; "
                         "default 6144)")
    args = ap.parse_args()
    if args.list:
        for case in CASES:
            print(f"{case.name}{' (slow)' if case.slow else ''}: {' '.join(case.run.__doc__.split())}\n")
        return 0
    cases = CASES
    if args.cases:
        wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = [w for w in wanted if w not in {c.name for c in CASES}]
        if unknown:
            ap.error(f"unknown case(s) {unknown}; see --list")
        cases = [c for c in CASES if c.name in wanted]
    elif args.quick:
        cases = [c for c in cases if not c.slow]
    names = args.servers or ([args.only] if args.only else list(SERVER_NAMES))
    env, note = None, None
    try:
        env = anchors_env(args.anchors)
        if not Path(env.get("TRITONSERVER", "")).exists():
            raise FileNotFoundError(env.get("TRITONSERVER"))
    except (subprocess.CalledProcessError, FileNotFoundError, OSError) as e:
        note = f"anchors missing or incomplete at {args.anchors} ({e})"
        if "triton" in names:
            if args.servers or args.only:
                print(f"error: {note}", file=sys.stderr)
                return 2
            names = [n for n in names if n != "triton"]
            print(f"{note}: measuring shmserve only", file=sys.stderr)

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = out_path(args.out)
    log_stem = json_path.with_suffix("")
    if any(c.name.endswith("gzip_bomb") for c in cases):
        print("making the gzip bomb (1 GiB of zeros) ...", file=sys.stderr, flush=True)
        gzip_bomb()
    tmp = Path(tempfile.mkdtemp(prefix="hostile-repo-"))
    shutil.copytree(PERF_DIR / "triton_repo" / MODEL, tmp / MODEL)
    results: dict[str, list[dict]] = {}
    problems: list[str] = []
    shm_pids: set[int] = set()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t_run = time.monotonic()
    try:
        for name in names:
            server = (TritonServer(args.anchors, env, tmp, Path(os.devnull)) if name == "triton"
                      else ShmServer(tmp, tuple(args.shmserve_ports), Path(os.devnull)))
            managed = Managed(server, log_stem)
            try:
                managed.start()
                results[name] = asyncio.run(run_server(managed, cases, args))
                problems += [f"{name}: {r['case']}: benchmark error {r['benchmark_error']}"
                             for r in results[name] if r.get("benchmark_error")]
            except (ServerError, OSError, subprocess.SubprocessError) as e:
                problems.append(f"{name}: {e}")
                print(f"ERROR: {name}: {e}", file=sys.stderr)
            finally:
                managed.stop()
                if name == "shmserve":
                    shm_pids |= managed.pids
                if managed.leftovers:
                    problems.append(f"{name}: processes {managed.leftovers} outlived the server (killed)")
    except KeyboardInterrupt:
        problems.append("interrupted (Ctrl-C)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        left = shm_ours(shm_pids)
        if left:
            problems.append(f"/dev/shm segments left by shmserve (removed): {left[:5]}{'...' if len(left) > 5 else ''}")
            for name in left:
                try:
                    os.unlink(f"/dev/shm/{name}")
                except OSError:
                    pass
        git = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.strip()
        doc = dict(started_utc=started, duration_s=round(time.monotonic() - t_run), git_head=git,
                   cpus=os.cpu_count(), args={k: str(v) for k, v in vars(args).items()},
                   cases=[c.name for c in cases], note=note, problems=problems,
                   thresholds=dict(stall_ms=STALL_MS, growth_mib=GROWTH_MIB, probe_timeout_ms=PROBE_TIMEOUT_S * 1000),
                   servers={name: dict(cases=recs, summary=summary(recs)) for name, recs in results.items()})
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
    text = table(results) + "".join(f"\n- problem: {p}" for p in problems)
    json_path.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {json_path}", file=sys.stderr)
    return 1 if problems else 0
