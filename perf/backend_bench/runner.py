"""One run of bench_backends.py: the in-process limit of each model, then each server in turn,
one at a time (Triton under the anchors' lock), and the report; the options and their --quick
defaults."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from servers import (Server, ShmServer, TritonServer, add_server_arguments, add_steal_arguments,
                     interpreters_line, measure_steady, new_run, publish, run_metadata, run_servers,
                     serve_and_measure)
from .anchor_triton import anchor_triton_lock, triton_onnxruntime
from .inprocess import run_inprocess
from .measure import PROTOCOLS, check_and_measure, measurement_args
from .models import HEAVY_WIDTH, TINY_COLS, Model
from .repositories import remove_model_files, write_repositories
from .report import report


def parse_args(doc: str):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="short measurement windows (perf_analyzer -p 500, up to 6 windows, -s 100; 0.2 s in-process per batch size)")
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    ap.add_argument("--threads", type=int, default=cores,
                    help=f"intra_op_thread_count of both models, and the in-process loop's (default {cores}: "
                         "this machine's cores, what shmserve picks for one instance)")
    ap.add_argument("--protocols", nargs="+", choices=tuple(PROTOCOLS), default=list(PROTOCOLS))
    ap.add_argument("--tiny-concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--heavy-concurrency", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--heavy-blocks", type=int, default=6, help="512 -> 2048 -> 512 blocks of heavy (default 6)")
    ap.add_argument("--heavy-delay-us", type=int, default=2000, help="heavy's max_queue_delay_microseconds (2000)")
    ap.add_argument("--window-ms", type=int, help="perf_analyzer's window (-p), default 2000 (--quick 500)")
    ap.add_argument("--max-trials", type=int, help="perf_analyzer's --max-trials, default 10 (--quick 6)")
    ap.add_argument("--stability", type=int, help="perf_analyzer's -s (percent), default 20 (--quick 100)")
    ap.add_argument("--inprocess-s", type=float, help="in-process seconds per batch size, default 1 (--quick 0.2)")
    ap.add_argument("--tiny-min-runs", type=int, help="in-process runs of tiny per batch size, at least "
                                                      "(default 5000, --quick 500)")
    ap.add_argument("--keep-models", action="store_true", help="keep the .onnx files in the results folder")
    add_server_arguments(ap)
    add_steal_arguments(ap)
    args = ap.parse_args()
    quick = args.quick
    for key, normal, short in (("window_ms", 2000, 500), ("max_trials", 10, 6), ("stability", 20, 100),
                               ("inprocess_s", 1.0, 0.2), ("tiny_min_runs", 5000, 500)):
        if getattr(args, key) is None:
            setattr(args, key, short if quick else normal)
    if quick:
        args.steal_reruns = 0
    args.measurement_args = measurement_args(args, args.stability)
    return args


def main(doc: str) -> int:
    """bench_backends.py's command line; `doc` is that script's docstring, whose first paragraph
    --help prints."""
    args = parse_args(doc)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    env, out_dir, _, names = new_run(args, "backends")
    models = [Model("tiny", [("INPUT0", TINY_COLS), ("INPUT1", TINY_COLS)], TINY_COLS, 0, args.tiny_concurrency),
              Model("heavy", [("INPUT0", HEAVY_WIDTH)], HEAVY_WIDTH, args.heavy_delay_us, args.heavy_concurrency)]
    errors, records = [], []
    triton_ort, triton_venv = triton_onnxruntime(env)
    if "triton" in names and triton_ort is None:
        errors.append(f"the anchors' Triton venv cannot import onnxruntime ({triton_venv}); install it as this "
                      "script's docstring says. Triton not measured")
        names = [n for n in names if n != "triton"]
    shm_ort = subprocess.run([ShmServer.python(), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                             stdout=subprocess.PIPE, text=True).stdout.strip() or None
    versions = {"shmserve": shm_ort, "triton": triton_ort}
    meta = run_metadata(args, env, onnxruntime=versions, triton_venv=triton_venv)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    try:
        shm_repo, triton_repo, files = write_repositories(out_dir, models, args)
        servers = {"triton": TritonServer(args.anchors, env, triton_repo, out_dir / "triton.log"),
                   "shmserve": ShmServer(shm_repo, tuple(args.shmserve_ports), out_dir / "shmserve.log")}
        pa = (env["PERF_ANALYZER"], env["PA_LD"])
        import onnxruntime as ort  # here only for the output checks
        sessions = {m.name: ort.InferenceSession(str(files[m.name]), providers=["CPUExecutionProvider"])
                    for m in models}

        for model in models:
            rec = dict(kind="inprocess", model=model.name,
                       **measure_steady(lambda model=model: run_inprocess(model, files[model.name], args),
                                        args.max_steal, args.steal_reruns))
            records.append(rec)
            print(json.dumps(rec), file=sys.stderr, flush=True)
        options = [r["options"] for r in records if r["kind"] == "inprocess" and r["error"] is None]
        args.inprocess_options = options[0] if options else None

        def run_one(server: Server) -> list[str]:
            def measure_all(errs):
                return check_and_measure(server, models, pa, out_dir, args, sessions, records, errs)

            if server.name != "triton":
                return serve_and_measure(server, measure_all)
            with anchor_triton_lock():
                return serve_and_measure(server, measure_all)

        errors += run_servers(servers, names, out_dir, records, run_one)
    finally:
        if not args.keep_models:
            remove_model_files(out_dir)
    errors += [f"in-process {r['model']}: {r['error']}" for r in records if r["kind"] == "inprocess" and r["error"]]
    errors += [f"{r['server']} {r['model']} {r['protocol']} c={r['concurrency']}"
               f"{' (also at -s %d)' % r['retried_with_s'] if r.get('retried_with_s') else ''}: {r['error']}"
               for r in records if r["kind"] == "perf_analyzer" and r["error"]]
    if versions["triton"] and versions["shmserve"] and versions["triton"] != versions["shmserve"]:
        errors.append(f"onnxruntime differs: {versions['shmserve']} for shmserve, {versions['triton']} "
                      "in Triton's venv")
    text = report(records, models, args, versions, time.monotonic() - started) + interpreters_line(env)
    return publish(out_dir, text, errors)
