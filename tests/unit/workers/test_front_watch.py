"""workers/front_watch.py: the processes a front started unlink its shared memory once it is
killed, and only then. A "front" here is a small script that creates segments named for its pid
(as the server's arenas are), and a client-like region, then starts the process under test and
waits to be killed."""

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from shmserve.ipc.segments import Segment, unlink_segments_of
from workers import front_watch
from workers.front_watch import wait_for_exit
from tests.conftest import ROOT

SHM_DIR = "/dev/shm"
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
WAIT_S = 10.0

# argv: token, then the command of its child, to which it appends its own pid. Prints the
# child's pid once its segments exist.
FRONT = r"""
import os, subprocess, sys, time
from shmserve.ipc.segments import Segment, segment_name
token = sys.argv[1]
made = [Segment.create(segment_name(os.getpid(), f"{token}.{tag}"), 4096)
        for tag in ("in.0", "out.1", "req.2")]
client = Segment.create(f"/shmtest_client.{token}", 4096)  # a client's region
child = subprocess.Popen(sys.argv[2:] + [str(os.getpid())], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""

# A worker stuck in a long execute(): the main thread sleeps, the watch thread watches.
STUCK_WORKER = r"""
import sys, time
from workers.front_watch import FrontWatch
FrontWatch(int(sys.argv[1]))
time.sleep(120)
"""


@pytest.fixture
def token():
    tok = uuid.uuid4().hex
    yield tok
    leftovers = [entry for entry in os.listdir(SHM_DIR) if tok in entry]
    for entry in leftovers:
        os.unlink(os.path.join(SHM_DIR, entry))
    assert not [e for e in leftovers if not e.startswith("shmtest_client.")], leftovers


@pytest.fixture
def processes():
    """Pids to end (by pid) after the test, should it fail before they end by themselves."""
    pids = []
    yield pids
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _own_segments(pid: int, token: str) -> list:
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(f"shmserve.{pid}.") and token in e)


def _until(check, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _start_front(token: str, child_cmd: list, stderr, processes: list):
    front = subprocess.Popen([sys.executable, "-c", FRONT, token, *child_cmd], env=ENV,
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)
    processes.append(front.pid)
    line = front.stdout.readline()
    assert line, "the front did not start its child"
    child = int(line)
    processes.append(child)
    assert len(_own_segments(front.pid, token)) == 3
    return front, child


def test_watchdog_unlinks_the_killed_fronts_segments_and_exits(token, processes, tmp_path):
    err = open(tmp_path / "stderr", "w+")
    front, watchdog = _start_front(token, [sys.executable, "-m", "workers.front_watch"], err,
                                   processes)
    # Never while the front lives.
    time.sleep(0.5)
    assert len(_own_segments(front.pid, token)) == 3
    assert _running(watchdog)
    front.kill()
    assert _until(lambda: not _own_segments(front.pid, token))
    assert _until(lambda: not _running(watchdog))
    front.wait()
    # A client's own region is not the server's to unlink.
    Segment.attach(f"/shmtest_client.{token}").close()
    err.seek(0)
    assert (f"the server process {front.pid} exited without stopping: removed its 3 "
            f"shared-memory segment(s)") in err.read()


def test_worker_stuck_in_execute_unlinks_and_exits_when_the_front_is_killed(token, processes):
    front, worker = _start_front(token, [sys.executable, "-c", STUCK_WORKER], None, processes)
    time.sleep(0.5)
    assert _running(worker) and len(_own_segments(front.pid, token)) == 3
    front.kill()
    assert _until(lambda: not _own_segments(front.pid, token))
    assert _until(lambda: not _running(worker))
    front.wait()
    Segment.attach(f"/shmtest_client.{token}").close()


def test_a_front_that_lives_on_is_left_alone():
    # The worker found the front's socket closed, but the front (this process) lives: it
    # waits a moment and ends as usual, unlinking nothing.
    code = ("import os, sys\n"
            "from workers.front_watch import FrontWatch\n"
            "FrontWatch(int(sys.argv[1])).exit_if_gone(0.3)\n"
            "print('returned')\n")
    out = subprocess.run([sys.executable, "-c", code, str(os.getpid())], env=ENV, cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "returned\n", out


def test_a_front_already_gone_is_seen_at_once():
    dead = subprocess.Popen(["true"])
    dead.wait()
    started = time.monotonic()
    wait_for_exit(dead.pid)  # no such process any more
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("pidfd", [True, False])
def test_wait_for_exit_returns_once_the_process_exits(pidfd, monkeypatch):
    if not pidfd:  # as on a kernel without pidfds (before Linux 5.3)
        def no_pidfd(pid, flags=0):
            raise OSError(38, "Function not implemented")
        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
        monkeypatch.setattr(front_watch, "POLL_S", 0.02)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        done = threading.Event()
        watcher = threading.Thread(target=lambda: (wait_for_exit(proc.pid), done.set()),
                                   daemon=True)
        watcher.start()
        assert not done.wait(0.3)
        proc.kill()
        if not pidfd:  # kill() still finds a zombie: polling sees its end once reaped
            proc.wait()
        assert done.wait(WAIT_S)  # with a pidfd, already while it is a zombie
    finally:
        proc.kill()
        proc.wait()


def test_polling_sees_a_parent_exit_while_it_is_a_zombie(token, processes, tmp_path):
    # Without pidfds, a child of the front sees the front's exit as its own reparenting, even
    # while the front stays a zombie that kill() still finds (nobody has reaped it yet).
    watcher = ("import os, sys, workers.front_watch as fw\n"
               "def no_pidfd(pid, flags=0):\n"
               "    raise OSError(38, 'Function not implemented')\n"
               "os.pidfd_open = no_pidfd\n"
               "fw.POLL_S = 0.02\n"
               "fw.wait_for_exit(int(sys.argv[2]))\n"
               "open(sys.argv[1], 'w').close()\n")
    seen = tmp_path / "seen"
    front, child = _start_front(token, [sys.executable, "-c", watcher, str(seen)], None,
                                processes)
    time.sleep(0.3)
    assert not seen.exists()
    front.kill()
    assert _until(lambda: not _running(front.pid))  # a zombie: not reaped on purpose
    assert _until(seen.exists)
    front.wait()
    unlink_segments_of(front.pid)  # this watcher only watched: they are the test's to remove
