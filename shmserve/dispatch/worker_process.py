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
from dataclasses import dataclass
from typing import Optional

from shmserve.observability import logs


@dataclass(frozen=True)
class PythonEnvironment:
    """A model's own Python environment (Triton's EXECUTION_ENV_PATH, made ready by
    repository/python_environments.py): its workers run its interpreter, with its packages
    first and the server's after them."""

    root: str  # holds bin/activate
    python: str  # its interpreter, of the server's Python version
    # A folder holding only the server's `shmserve` and `workers` packages (links to them), put
    # before the environment's packages: the folder they lie in may hold the server's other
    # packages too (its site-packages, once installed), which must come after.
    code: str


class WorkerProcess:
    """A worker process and its log, from its spawn until its exit is reported."""

    def __init__(self, log_context: dict, environment: Optional[PythonEnvironment] = None):
        """`log_context`: the instance's log context, which its lines are logged with;
        `environment`: the model's own Python environment, if it has one."""
        self.log = logs.WorkerLog(log_context)
        self._environment = environment
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
            *worker_command("workers", *args, environment=self._environment),
            pass_fds=pass_fds, stdin=stdin, stdout=stdout, stderr=stderr,
            env=worker_env(self._environment))
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
# In a model's own environment, the server's packages (numpy, msgpack, posix_ipc, for what the
# environment lacks) come after the environment's: they are named in _FALLBACK.
_FALLBACK = "SHMSERVE_FALLBACK_PATH"
_RUN_MODULE = ("import os, runpy, sys\n"
               "if sys.path and sys.path[0] == '': del sys.path[0]\n"
               f"sys.path.extend(p for p in os.environ.pop('{_FALLBACK}', '').split(os.pathsep)"
               " if p)\n"
               "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def worker_command(module: str, *args: str,
                   environment: Optional[PythonEnvironment] = None) -> list:
    """The command line that runs `module` (`workers`, say) as a child process, with `args` as
    its sys.argv[1:]; run it with worker_env() (of the same `environment`)."""
    python = environment.python if environment is not None else sys.executable
    return [python, "-c", _RUN_MODULE, module, *args]


def code_root() -> str:
    """The folder that holds the `shmserve` and `workers` packages this server runs: its
    checkout, or the site-packages it is installed in."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_env(environment: Optional[PythonEnvironment] = None) -> dict:
    env = dict(os.environ)
    # Workers must import this checkout's `workers` and `shmserve.ipc` even when the server
    # runs from a source tree rather than an installed package.
    root = environment.code if environment is not None else code_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if environment is not None:
        # As Triton's Python backend starts its stub in such an environment (what its
        # bin/activate sets).
        env["VIRTUAL_ENV"] = environment.root
        env["PATH"] = os.path.join(environment.root, "bin") + _after(env.get("PATH"))
        env["LD_LIBRARY_PATH"] = (os.path.join(environment.root, "lib")
                                  + _after(env.get("LD_LIBRARY_PATH")))
        env.pop("PYTHONHOME", None)
        env[_FALLBACK] = os.pathsep.join(
            p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return env


def _after(value: Optional[str]) -> str:
    return os.pathsep + value if value else ""
