"""One process of a model instance's worker, as the front starts and ends it.

The worker runs as `python -m workers` with this checkout's code (`worker_command`,
`worker_env`), its output relayed to the server log (observability/logs.py WorkerLog). The
instance's handle (dispatch/worker.py) spawns a new one at every start and restart, and waits
for each one's exit: an exit it did not ask for is a crash.
"""

import asyncio
import os
import signal
import sys
from typing import Optional

from shmserve.observability import logs


class WorkerProcess:
    """A worker process and its log, from its spawn until its exit is reported."""

    def __init__(self, log_context: dict):
        """`log_context`: the instance's log context, which its lines are logged with."""
        self.log = logs.WorkerLog(log_context)
        self._proc: Optional[asyncio.subprocess.Process] = None

    @property
    def spawned(self) -> bool:
        return self._proc is not None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Spawned and not yet exited (as far as the front has seen)."""
        return self._proc is not None and self._proc.returncode is None

    async def spawn(self, args: tuple, pass_fds: tuple) -> None:
        """Start `python -m workers` with `args` as its arguments, handing it `pass_fds`."""
        stdin, stdout, stderr = self.log.child_fds
        self._proc = await asyncio.create_subprocess_exec(
            *worker_command("workers", *args), pass_fds=pass_fds, stdin=stdin, stdout=stdout,
            stderr=stderr, env=worker_env())
        await self.log.started(self._proc.pid)

    async def abandon(self) -> None:
        """Its start failed: kill it, if it was spawned, and close its log."""
        if self._proc is not None:
            self._proc.kill()
            await self._proc.wait()
        await self.log.close()

    async def exit_code(self) -> str:
        """How it ended, once it has: 'code 3', 'code -9 (SIGKILL)'."""
        assert self._proc is not None  # asked only of a spawned process
        return exit_text(await self._proc.wait())

    def kill(self) -> None:
        assert self._proc is not None  # the caller checked `running`
        try:
            self._proc.kill()
        except ProcessLookupError:  # exited already; its exit is reported all the same
            pass

    async def reap(self, timeout: float) -> None:
        """Wait `timeout` for it to end, then kill it; then log its last lines (what the
        model's finalize() wrote is logged before this returns)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        await self.log.close()


def exit_text(returncode: int) -> str:
    """'code 3', or 'code -9 (SIGKILL)' for a process a signal ended."""
    if returncode < 0:
        try:
            return f"code {returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            pass
    return f"code {returncode}"


# `python -m` would put the current directory first on sys.path, so a server started from a
# directory holding a `workers` or `shmserve` folder (an older checkout, a project's own
# workers) would run that code in its workers. Dropped before the module is found; -P would do
# the same, from Python 3.11 on.
_RUN_MODULE = ("import runpy, sys\n"
               "if sys.path and sys.path[0] == '': del sys.path[0]\n"
               "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def worker_command(module: str, *args: str) -> list:
    """The command line that runs `module` (`workers`, say) as a child process, with `args` as
    its sys.argv[1:]; run it with worker_env()."""
    return [sys.executable, "-c", _RUN_MODULE, module, *args]


def worker_env() -> dict:
    env = dict(os.environ)
    # Workers must import this checkout's `workers` and `shmserve.ipc` even when the server
    # runs from a source tree rather than an installed package.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
