"""The watchdog process that unlinks the front's shared memory should the front be killed.

The front unlinks its segments as it stops; killed, it cannot. Its workers then do it (see
workers/front_watch.py), but a front may be killed while none runs: creating the arenas of its
first instance, or restarting its only one. So the server starts this one small process (the
module workers.front_watch) before it creates any segment: it waits for the front's exit and
then unlinks every segment named for the front's pid. It never unlinks while the front lives;
the front ends it as it stops.
"""

import asyncio
import logging
import os
import subprocess
from typing import Optional

from shmserve.dispatch.worker_process import worker_command, worker_env

log = logging.getLogger("shmserve.dispatch")


class SegmentWatchdog:
    def __init__(self) -> None:
        self._process: Optional[asyncio.subprocess.Process] = None

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Start the watchdog; a failure to is logged, and the workers alone clean up."""
        if self._process is not None:
            return
        try:
            self._process = await asyncio.create_subprocess_exec(
                *worker_command("workers.front_watch", str(os.getpid())),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=worker_env(),
                # Its own session: a signal to the server's process group (Ctrl-C, a hangup)
                # must not end it before it could clean up; it ends with the front anyway.
                start_new_session=True)
        except OSError as exc:
            log.warning("cannot start the shared-memory watchdog (%s): should this process be "
                        "killed while no model instance runs, its shared memory stays in "
                        "/dev/shm until the next server start", exc)

    async def stop(self) -> None:
        """End the watchdog (the front has unlinked its segments itself by now)."""
        proc, self._process = self._process, None
        if proc is None:
            return
        if proc.returncode is None:
            try:
                proc.terminate()
            except ProcessLookupError:
                pass
        await proc.wait()
