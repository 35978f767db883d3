"""A server under attack: started, restarted after it died, hung or kept too much, and stopped,
with a log per start and whatever it started (Triton's python-backend stubs) killed after it
and reported."""
import os
import signal
import time
from pathlib import Path

from servers import ShmServer, http_ok, process_tree
from .payloads import MODEL


def alive(server) -> bool:
    if server.pid is None:
        return False
    if isinstance(server, ShmServer):
        return server.proc is not None and server.proc.poll() is None
    try:
        with open(f"/proc/{server.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def healthy(server, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(server):
            return False
        if http_ok(f"http://127.0.0.1:{server.http_port}/v2/health/ready"):
            return True
        time.sleep(0.5)
    return False


def _starttime(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


class Managed:
    """A server we start, restart and stop, with a log per start, and whatever it started
    (Triton's python-backend stubs) killed after it if still alive."""

    def __init__(self, server, log_stem: Path):
        self.server, self.log_stem = server, log_stem
        self.starts = 0
        self.pids: set[int] = set()   # of every start
        self.tree: dict[int, str | None] = {}
        self.leftovers: list[int] = []

    def start(self) -> None:
        self.starts += 1
        self.server.log_path = Path(f"{self.log_stem}-{self.server.name}-{self.starts}.log")
        self.server.start()
        self.pids.add(self.server.pid)
        self.server.wait_model_ready(MODEL)
        self.tree = {pid: _starttime(pid) for pid in process_tree(self.server.pid)}

    def stop(self) -> None:
        self.leftovers += self.server.stop()
        # Triton's stubs end on their own soon after it: given 10 s, then killed and reported.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                started is not None and _starttime(pid) == started for pid, started in self.tree.items()):
            time.sleep(0.2)
        for pid, started in self.tree.items():
            if started is not None and _starttime(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.leftovers.append(pid)
                except ProcessLookupError:
                    pass
        self.tree = {}

    def restart(self) -> None:
        self.stop()
        self.start()
