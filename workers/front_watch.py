"""What the processes the front started do when the front dies without stopping them.

The front creates every shared-memory segment of the server (/dev/shm/shmserve.<front pid>.*,
see shmserve/ipc/segments.py) and unlinks them as it stops. Killed (SIGKILL, the OOM killer, a
crash), it unlinks nothing, and its segments would stay until the next server start swept them.
Triton leaves none, so its children clean up after it:

- each worker runs a `FrontWatch`: a thread, independent of the model's (which may be in a long
  execute()), that waits for the front's exit, unlinks the front's segments and ends the worker,
  as Triton's stub ends when its server is gone;
- the front starts one watchdog process, this module run as `python -m workers.front_watch
  <front pid>` (shmserve/dispatch/watchdog.py), before it creates any segment. It covers a
  front killed while none of its workers runs (it is creating the arenas of the first one, or
  of an instance it restarts), and one whose workers died with it. It is in a session of its
  own, so that a signal to the server's process group (Ctrl-C, a terminal's hangup) leaves it
  to do its job; it exits with the front either way, and the front ends it as it stops.

Only the exit of the front process counts, seen through a pidfd (at once), or by polling where
the kernel has none (before Linux 5.3). A worker's own crash, or a socket the front closed,
unlinks nothing, so no live front loses memory it uses. Whoever comes first unlinks; the
others find the names gone, which is fine. A client's registered region is never named like a
server segment (the front refuses such a name), so it stays.
"""

import os
import select
import sys
import threading
import time

from shmserve.ipc.priority import restore_worker_nice
from shmserve.ipc.scratch import remove_folders_of
from shmserve.ipc.segments import unlink_segments_of

# Without a pidfd, how often the front is looked at (Triton's stub looks every 300 ms).
POLL_S = 0.25
# A worker's exit status once its front is gone (nobody reads it; Triton's stub exits with 1).
EXIT_FRONT_GONE = 1


def wait_for_exit(pid: int) -> None:
    """Return once the process `pid` has exited (a zombie counts as exited)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd here: look now and then
        _poll_for_exit(pid)
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # readable once the process has exited
            pass
    finally:
        os.close(fd)


def _poll_for_exit(pid: int) -> None:
    # A child whose parent exits goes to another parent at once, while the parent itself may
    # stay a zombie (which kill() still finds) until its own parent reaps it.
    child = os.getppid() == pid
    while True:
        if child and os.getppid() != pid:
            return
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            # PermissionError: the pid is another user's now, so no longer our front's
            return
        time.sleep(POLL_S)


def clean_up_after(front_pid: int) -> list:
    """Unlink the segments of the front `front_pid`, which has exited, and remove its scratch
    folders (shmserve/ipc/scratch.py); their names."""
    removed = remove_folders_of(front_pid)
    try:
        return unlink_segments_of(front_pid) + removed
    except OSError:  # no /dev/shm to look in: nothing of the front's can be there
        return removed


class FrontWatch:
    """In a worker: once the front `front_pid` has exited, unlink its segments and end this
    process, whatever the model's thread is doing."""

    def __init__(self, front_pid: int):
        self._gone = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(front_pid,),
                                        name="shmserve-front-watch", daemon=True)
        self._thread.start()

    def _run(self, front_pid: int) -> None:
        wait_for_exit(front_pid)
        self._gone.set()
        try:
            clean_up_after(front_pid)
        finally:
            # Nobody is left to answer, nor to read what the model would print.
            os._exit(EXIT_FRONT_GONE)

    def exit_if_gone(self, timeout: float) -> None:
        """For the worker's main thread once the front's socket has closed: if the front has
        exited, or does within `timeout` seconds, this never returns (the watch thread
        unlinks, then ends the process); if it lives on, it closed the socket on purpose."""
        if self._gone.wait(timeout):
            self._thread.join()


def main(argv: list) -> int:
    """The watchdog process: wait for the front's exit, then unlink its segments."""
    restore_worker_nice()  # the front's --front-nice is the front's alone
    front_pid = int(argv[1])
    wait_for_exit(front_pid)
    removed = clean_up_after(front_pid)
    if removed:
        try:  # to where the front's stderr went
            print(f"shmserve watchdog (pid {os.getpid()}): the server process {front_pid} "
                  f"exited without stopping: removed its {len(removed)} shared-memory "
                  f"segment(s) and scratch folder(s)", file=sys.stderr, flush=True)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(list(sys.argv)))
