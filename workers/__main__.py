"""Worker process entry: `python -m workers <fd> [<spin_us> [<front pid>]]`.

The front passes one end of a socketpair as file descriptor <fd>. The worker reads Init,
loads the model with its backend (workers/backends), answers Ready, then serves frames until Shutdown. Should the front process
exit without a Shutdown (killed), the worker unlinks the front's shared memory and exits, even
in the middle of the model's execute() (see front_watch.py).

Logs: the front reads the worker's stdout and stderr line by line and puts every line in the
server log, tagged with the instance (shmserve/observability/logs.py). Log records go to
stderr one a line, as `RECORD_MARK` + JSON `[created, levelno, filename, lineno, logger,
message]`, so that they keep their level and source and a traceback stays one record. stdin
carries the server's verbose level, one line per change.
"""

import gc
import json
import logging
import os
import signal
import socket
import sys
import threading

RECORD_MARK = "\x1e"  # as shmserve.observability.logs.RECORD_MARK
# A killed front's end of the socket closes a moment before its exit can be seen: how long a
# worker that ends without having told the front (its socket closed, say) waits to see whether
# the front exited, and its shared memory is to be unlinked, before it just ends.
FRONT_EXIT_WAIT_S = 1.0


class _RecordLines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
            line = json.dumps([record.created, record.levelno, record.filename, record.lineno,
                               record.name, message])
            stream = sys.stderr
            stream.write(RECORD_MARK + line + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def _log_to_front() -> None:
    # Line-buffered, so that a print reaches the front at once and is not lost with the
    # process if it dies (stderr is line-buffered already).
    sys.stdout.reconfigure(line_buffering=True)
    root = logging.getLogger()
    root.addHandler(_RecordLines())
    # The first level was written before the worker started: no record misses it.
    _set_verbose(sys.stdin.readline())
    threading.Thread(target=_follow_verbose, name="shmserve-log-level", daemon=True).start()


def _set_verbose(line: str) -> None:
    try:
        verbose = int(line)
    except ValueError:
        verbose = 0
    logging.getLogger().setLevel(logging.DEBUG if verbose > 0 else logging.INFO)


def _follow_verbose() -> None:
    for line in iter(sys.stdin.readline, ""):
        _set_verbose(line)


def main(argv: list) -> int:
    # First: threads take their creator's nice value, and the log thread, or numpy's BLAS
    # threads (started as it is imported), must not keep the front's (see priority.py).
    from shmserve.ipc.priority import restore_worker_nice
    restore_worker_nice()
    fd = int(argv[1])
    spin_us = int(argv[2]) if len(argv) > 2 else None
    # Watched from the start: the front may be killed while this worker loads.
    from workers.front_watch import FrontWatch
    watch = FrontWatch(int(argv[3])) if len(argv) > 3 else None
    told = False
    try:
        code, told = _serve(fd, spin_us)
        return code
    finally:
        # Ended without telling the front (its socket closed, a send failed, a failure): if
        # that is because the front was killed, its shared memory goes with this worker.
        if not told and watch is not None:
            watch.exit_if_gone(FRONT_EXIT_WAIT_S)


def _serve(fd: int, spin_us) -> tuple:
    """(exit status, whether the front was told how the worker ended: its Shutdown answered,
    or the model's failure to load reported)."""
    # Models see the command line Triton's stub gives them, one empty argument: a model that
    # runs unittest.main() or argparse reads it.
    sys.argv[:] = [""]
    # The front owns shutdown; a Ctrl-C in the terminal must not kill workers mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _log_to_front()

    from shmserve.ipc import messages
    from shmserve.ipc.channel import SyncChannel
    from shmserve.ipc.idle_spin import DEFAULT_SPIN_US, STREAM_SPIN_US, IdleSpin
    from shmserve.ipc.malloc import WORKER_RETAIN, keep_large_blocks
    from shmserve.ipc.segments import Segment
    from workers import backends, cuda

    # BLS outputs copied out, and a model's own large arrays, reuse faulted-in memory.
    keep_large_blocks(WORKER_RETAIN)
    if spin_us is None:
        spin_us = DEFAULT_SPIN_US
    spin = IdleSpin(spin_us) if spin_us else None
    channel = SyncChannel(socket.socket(fileno=fd), spin=spin)
    init = channel.recv()
    if not isinstance(init, messages.Init):
        return 2, False
    os.environ.setdefault("SHMSERVE_INSTANCE", init.instance_name)
    # From here on the socket is read through the FrameReader: a model may call into the
    # server (BLS) from initialize() on, and from any thread.
    from workers import triton_python_backend_utils as pb_utils
    from workers.regions import ClientRegions, wants_gpu_inputs
    from workers.server_calls import CallArena, FrameReader
    regions = ClientRegions(gpu_inputs=init.instance_kind == "GPU"
                            and wants_gpu_inputs(init.model_config))
    arena = None
    if init.bls_arena:
        arena = CallArena(Segment.attach(init.bls_arena), init.inline_threshold)
    reader = FrameReader(channel, regions, arena)
    pb_utils._set_server_calls(reader)
    from workers.forked_calls import follow_forks
    follow_forks(reader, channel, pb_utils._set_server_calls)
    state_arena = None
    try:
        if init.state_arena:
            state_arena = Segment.attach(init.state_arena)
        instance = backends.load(backends.Context(
            model_name=init.model_name,
            model_version=init.model_version,
            model_dir=init.model_dir,
            model_config=init.model_config,
            instance_name=init.instance_name,
            instance_kind=init.instance_kind,
            device_id=init.device_id,
            model_repository=init.model_repository,
            state_memory=None if state_arena is None else state_arena.buffer,
            state_reserve=None if state_arena is None else state_arena.reserve,
            runtime_dir=init.runtime_dir,
        ))
        if spin is not None and instance.decoupled:
            spin.spin_s = max(spin.spin_s, STREAM_SPIN_US / 1e6)
        from workers.loop import WorkerLoop
        loop = WorkerLoop(channel, reader, instance, init, spin)
    except Exception as exc:  # reported to the front, which marks the model unavailable
        # A BackendError's message is the whole story, in Triton's words.
        channel.send(messages.Ready(str(exc) if isinstance(exc, backends.BackendError)
                                    else f"{type(exc).__name__}: {exc}"))
        return 1, True
    # The model and its libraries live as long as the worker: out of the collector's sight,
    # full collections between batches scan only what requests leave behind.
    gc.freeze()
    uuid = cuda.gpu_uuid(init.device_id) if init.instance_kind == "GPU" else ""
    channel.send(messages.Ready("", instance.has_readiness_hook, uuid))
    from workers import metrics_report
    metrics_report.start(channel, init.metrics_fd)
    try:
        shut_down = loop.run()
    except Exception:
        logging.getLogger("shmserve.worker").exception("worker loop failed")
        return 1, False
    finally:
        if state_arena is not None:
            state_arena.close()
    return 0, shut_down


if __name__ == "__main__":
    code = main(list(sys.argv))
    sys.stdout.flush()
    sys.stderr.flush()
    # A model may have started non-daemon threads; they must not keep a finished worker
    # (and its socket) alive, or the front would wait on it.
    os._exit(code)
