"""The front's scratch folders: named for its pid, removed by whoever outlives it."""

import os
import subprocess
import sys

from shmserve.ipc import scratch


def test_the_folders_of_a_pid_and_of_dead_servers_are_removed():
    mine = scratch.make_folder(os.getpid())
    open(os.path.join(mine, "file"), "w").close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = scratch.make_folder(int(dead.stdout))  # a pid that ran and exited
    try:
        assert os.path.basename(mine).startswith(f"shmserve_scratch.{os.getpid()}.")
        assert scratch.sweep_dead_folders() == [gone]  # this process lives: its folder stays
        assert os.path.isdir(mine) and not os.path.exists(gone)
        assert scratch.remove_folders_of(os.getpid()) == [mine]
        assert not os.path.exists(mine)
    finally:
        for path in (mine, gone):
            if os.path.exists(path):
                os.rmdir(path)
