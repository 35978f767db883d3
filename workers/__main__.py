"""Worker process entry: `python -m workers <fd>`.

The front passes one end of a socketpair as file descriptor <fd>. The worker reads Init,
loads the model, answers Ready, then serves frames until Shutdown.
"""

import logging
import os
import signal
import socket
import sys


def main(argv: list) -> int:
    fd = int(argv[1])
    # The front owns shutdown; a Ctrl-C in the terminal must not kill workers mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from shmserve.ipc import messages
    from shmserve.ipc.channel import SyncChannel
    from shmserve.ipc.shm import Segment
    from workers.runner import ModelRunner

    channel = SyncChannel(socket.socket(fileno=fd))
    init = channel.recv()
    if not isinstance(init, messages.Init):
        return 2
    os.environ.setdefault("SHMSERVE_INSTANCE", init.instance_name)
    state_arena = None
    try:
        if init.state_arena:
            state_arena = Segment.attach(init.state_arena)
        runner = ModelRunner(
            model_name=init.model_name,
            model_version=init.model_version,
            model_dir=init.model_dir,
            model_config=init.model_config,
            instance_name=init.instance_name,
            instance_kind=init.instance_kind,
            device_id=init.device_id,
            model_repository=init.model_repository,
            state_memory=None if state_arena is None else state_arena.buffer,
        )
        runner.initialize()
        from workers.loop import WorkerLoop
        loop = WorkerLoop(channel, runner, init)
    except Exception as exc:  # reported to the front, which marks the model unavailable
        channel.send(messages.Ready(f"{type(exc).__name__}: {exc}"))
        return 1
    channel.send(messages.Ready(""))
    try:
        loop.run()
    except Exception:
        logging.getLogger("shmserve.worker").exception("worker loop failed")
        return 1
    finally:
        if state_arena is not None:
            state_arena.close()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # A model may have started non-daemon threads; they must not keep a finished worker
    # (and its socket) alive, or the front would wait on it.
    os._exit(code)
