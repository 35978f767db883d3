"""The process that holds a model's session in each server (shmserve's worker, found by the
instance's shared memory it holds open; Triton's python-backend stub, by its command line), and
that process's memory from /proc."""
import os
import re
from pathlib import Path

from servers import process_tree


def memory_kib(pid: int) -> dict:
    keys = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in keys:
                found[key] = int(line.split()[1])
    return found


_ARENA = re.compile(r"^shmserve\.\d+\.(?P<instance>.+)\.[a-z]+\.\d+$")


def shmserve_worker(server_pid: int, model: str) -> int | None:
    """The worker of the model's first instance: the server's descendant holding that instance's
    shared memory (/dev/shm/shmserve.<front pid>.<model>_<group>_<n>.<kind>.<n>) open."""
    for pid in process_tree(server_pid)[1:]:
        try:
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for target in targets:
            m = _ARENA.match(os.path.basename(target)) if target.startswith("/dev/shm/") else None
            if m and m.group("instance").rsplit("_", 2)[0] == model:
                return pid
    return None


def triton_stub(server_pid: int, model: str, repository: Path) -> int | None:
    """The python-backend stub of the model: the descendant whose command line names its folder."""
    folder = str(repository / model)
    for pid in process_tree(server_pid)[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(arg.rstrip("/") == folder or arg.startswith(folder + "/") for arg in argv):
            return pid
    return None

