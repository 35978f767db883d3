"""One run of compat_probe.py: both servers started on a copy of the repository for the battery,
then again in explicit model control for the model-control sequence; the answers compared
case by case against KNOWN, and the report."""
import argparse
import contextlib
import os
import shutil
import sys
import time

from servers import (PERF_DIR, REPO_ROOT, ServerError, ShmServer, TritonServer, add_server_arguments,
                     anchors_env)
from .battery import answers
from .compare import differs, shown_difference
from .explicit_cases import NO_CONFIG_MODEL, management_answers, write_broken_models
from .known import KNOWN


@contextlib.contextmanager
def extra_args(flags: str):
    """Both servers started inside get `flags` (the anchors' TRITON_EXTRA_ARGS, shmserve's
    SHMSERVE_EXTRA_ARGS)."""
    saved = {key: os.environ.get(key) for key in ("TRITON_EXTRA_ARGS", "SHMSERVE_EXTRA_ARGS")}
    for key, value in saved.items():
        os.environ[key] = f"{value or ''} {flags}".strip()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def remove_triton_leftovers(before: set) -> None:
    """Triton's Python backend can leave its segments behind when a stub dies (a model that
    fails to load, say): remove those this run's Triton made."""
    for name in set(os.listdir("/dev/shm")) - before:
        if name.startswith("triton_python_backend_shm_region_"):
            print(f"removed /dev/shm/{name}, left by Triton", file=sys.stderr)
            os.unlink(f"/dev/shm/{name}")


def main(doc: str) -> int:
    """compat_probe.py's command line; `doc` is that script's docstring, whose first paragraph
    --help prints."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_server_arguments(ap)
    ap.add_argument("--verbose", action="store_true", help="print the known differences too")
    args = ap.parse_args()
    log_dir = PERF_DIR / "results" / time.strftime("compat-%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True)
    # triton_repo, the streaming text model of model_repository/, and the test models that
    # show what generate makes of a body's keys.
    repo = log_dir / "repo"
    shutil.copytree(PERF_DIR / "triton_repo", repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "model_repository" / "textgen", repo / "textgen",
                    ignore=shutil.ignore_patterns("__pycache__", "corpus.txt", "train.py"))
    for name in ("params_echo", "keyword_inputs", "sender_misuse"):
        shutil.copytree(REPO_ROOT / "tests" / "models" / name, repo / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    segments_before = set(os.listdir("/dev/shm"))
    triton = TritonServer(args.anchors, anchors_env(args.anchors), repo, log_dir / "triton.log")
    shmserve = ShmServer(repo, tuple(args.shmserve_ports), log_dir / "shmserve.log")
    try:
        triton.start()
        shmserve.start()
        theirs = answers(triton.ports)
        ours = answers(shmserve.ports)
        for server in (shmserve, triton):
            server.stop()
        # Again in explicit model control, on a copy of the repository (loads with files
        # must not write into it, but a bug might).
        explicit = log_dir / "explicit_repo"
        shutil.copytree(repo, explicit, ignore=shutil.ignore_patterns("__pycache__"))
        write_broken_models(explicit)
        (explicit / "no_config" / "1").mkdir(parents=True)
        (explicit / "no_config" / "1" / "model.py").write_text(NO_CONFIG_MODEL)
        triton = TritonServer(args.anchors, anchors_env(args.anchors), explicit,
                              log_dir / "triton_explicit.log")
        shmserve = ShmServer(explicit, tuple(args.shmserve_ports), log_dir / "shmserve_explicit.log")
        with extra_args("--model-control-mode=explicit"):
            triton.start()
            shmserve.start()
        theirs.update(management_answers(triton.ports))
        ours.update(management_answers(shmserve.ports))
    except (ServerError, OSError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    finally:
        for server in (shmserve, triton):
            server.stop()
        remove_triton_leftovers(segments_before)
    new = 0
    for name in theirs.keys() | ours.keys():
        if not differs(theirs.get(name), ours.get(name)):
            continue
        known = KNOWN.get(name)
        if known is None and name.startswith("counted ") and name[8:] in KNOWN:
            known = "what it answers differs (above), and with it what it counts"
        new += known is None
        if known is None or args.verbose:
            print(f"{'known' if known else 'NEW'}: {name}" + (f"  ({known})" if known else ""))
            for line in shown_difference(theirs.get(name), ours.get(name)):
                print(line)
    same = sorted(name for name in KNOWN if name in theirs and not differs(theirs[name], ours.get(name)))
    if same:  # a difference kept on purpose that is gone: its entry is stale
        print("known differences that did not show: " + ", ".join(same))
    print(f"{len(theirs)} cases, {new} unexpected differences; logs in {log_dir}")
    return 1 if new else 0
