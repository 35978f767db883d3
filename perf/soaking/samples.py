"""The server-side view of a soak: a sample of what the server's processes hold (RSS and open
fds per process, named front or by the instance a worker serves; its /dev/shm segments; its
request counters from /metrics), and the client's own shared-memory regions left behind. Read
from /proc and /dev/shm, not from the server, so that what the server forgets to free is seen."""
import os
import re
import time
import urllib.request
from collections import Counter

from servers import ShmServer, open_fds, process_tree, rss_kib


def worker_labels(server_pid: int) -> dict[int, str]:
    """pid -> 'front' or the instance whose arenas a worker maps (e.g. 'add_sub_0_0')."""
    pattern = re.compile(rf"/dev/shm/shmserve\.{server_pid}\.(.+)\.(?:in|out|req|state)\.\d+$")
    labels = {}
    for pid in process_tree(server_pid):
        if pid == server_pid:
            labels[pid] = "front"
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                tags = {m.group(1) for line in f if (m := pattern.search(line.rstrip()))}
        except OSError:
            tags = set()
        labels[pid] = ",".join(sorted(tags)) or f"pid {pid}"
    return labels


def server_segments(server_pid: int) -> dict:
    count = size = allocated = 0
    for entry in os.scandir("/dev/shm"):
        if entry.name.startswith(f"shmserve.{server_pid}."):
            st = entry.stat()
            count, size, allocated = count + 1, size + st.st_size, allocated + st.st_blocks * 512
    return dict(segments=count, bytes=size, allocated=allocated)


def our_regions() -> list[str]:
    return [e.name for e in os.scandir("/dev/shm") if e.name.startswith(f"soak_{os.getpid()}_")]


def request_metrics(metrics_port: int) -> dict:
    """success per model, failure per reason (summed over models)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    success, failure = Counter(), Counter()
    for line in text.splitlines():
        m = re.match(r'nv_inference_request_(success|failure)\{(.*)\} (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            if m.group(1) == "success":
                success[labels["model"]] += int(float(m.group(3)))
            else:
                failure[labels["reason"]] += int(float(m.group(3)))
    return dict(success=dict(success), failure=dict(failure))


def sample(server: ShmServer, labels: dict[int, str], started: float, tag: str) -> dict:
    procs = {}
    for pid in process_tree(server.pid):
        try:
            procs[labels.get(pid, f"new pid {pid}")] = dict(pid=pid, rss_mib=rss_kib(pid) / 1024, fds=open_fds(pid))
        except OSError:
            pass
    return dict(tag=tag, t_s=round(time.monotonic() - started, 1), procs=procs,
                shm=server_segments(server.pid), metrics=request_metrics(server.metrics_port))

