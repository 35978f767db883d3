"""Folders the front makes under the temporary directory (the Python environments it unpacks
for models), named for its pid as its shared-memory segments are (segments.py), so that
whoever outlives a killed front removes them (workers/front_watch.py) and a later server
start removes those of fronts that no longer run. As for segments, a pid names a server only
within its pid namespace: servers in containers that share one temporary directory (and one
/dev/shm) must not share a pid namespace's numbering, or one's start may take another's
folders for a dead server's."""

import os
import re
import shutil
import tempfile

from shmserve.ipc.segments import pid_alive

_PREFIX = "shmserve_scratch."
# shmserve_scratch.<pid>.<random>, as make_folder builds it
_NAME = re.compile(r"shmserve_scratch\.([1-9][0-9]*)\.[^/]+")


def make_folder(server_pid: int) -> str:
    """A new, empty folder of the server process `server_pid`."""
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{server_pid}.")


def remove_folders_of(server_pid: int) -> list[str]:
    """Remove every folder of the server `server_pid`; their paths. Only for a caller that
    knows that process has exited, or is that process stopping."""
    return _remove_where(lambda pid: pid == server_pid)


def sweep_dead_folders() -> list[str]:
    """Remove the folders of servers that no longer run; their paths."""
    return _remove_where(lambda pid: not pid_alive(pid))


def _remove_where(wanted) -> list[str]:
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _NAME.fullmatch(name)
        if match and wanted(int(match.group(1))):
            path = os.path.join(base, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed

