"""The memory of the server's main process: VmHWM (reset through /proc/<pid>/clear_refs before an
attack) and VmRSS sampled every 50 ms by a thread, which stops an attack once the RSS passes the
limit, so that a server that buffers without limit cannot take the machine."""
import threading
import time
from typing import Callable

from servers import rss_kib


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def reset_hwm(pid: int) -> None:
    """Sets VmHWM to the current VmRSS (clear_refs 5, Linux 4.0+)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


class RssWatch(threading.Thread):
    """Samples VmRSS every 50 ms; calls on_limit once when it passes limit_kib."""

    def __init__(self, pid: int, limit_kib: int, on_limit: Callable[[], None]):
        super().__init__(daemon=True)
        self.pid, self.limit_kib, self.on_limit = pid, limit_kib, on_limit
        self.max_kib = 0
        self.tripped_at: float | None = None
        self.t0 = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                rss = rss_kib(self.pid)
            except (OSError, StopIteration):
                return
            self.max_kib = max(self.max_kib, rss)
            if rss > self.limit_kib and self.tripped_at is None:
                self.tripped_at = time.monotonic() - self.t0
                self.on_limit()
            self.done.wait(0.05)

    def stop(self) -> None:
        self.done.set()
        self.join()
