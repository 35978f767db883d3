"""Restarts model instances whose process died, with exponential backoff."""

import asyncio
import logging

from shmserve.errors import ServerError

log = logging.getLogger("shmserve.dispatch")

BACKOFF_START = 0.5
BACKOFF_MAX = 30.0


class Supervisor:
    def __init__(self):
        self._pools: dict = {}  # WorkerHandle -> InstancePool
        self._tasks: set = set()
        self._stopping = False

    def watch(self, pool) -> None:
        for inst in pool.instances:
            self._pools[inst] = pool
        for inst in pool.instances:
            if not inst.alive:  # died between its start and now, before anyone watched
                self.instance_exited(inst)

    def instance_exited(self, inst) -> None:
        pool = self._pools.get(inst)
        if pool is None or self._stopping:
            return
        log.error("model instance '%s' (pid %s) died; restarting it", inst.instance_name, inst.pid)
        pool.wake_all()
        task = asyncio.ensure_future(self._restart(inst, pool))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, inst, pool) -> None:
        delay = BACKOFF_START
        while not self._stopping and self._pools.get(inst) is pool:
            await inst.stop()
            await asyncio.sleep(delay)
            if self._stopping or self._pools.get(inst) is not pool:
                return
            try:
                await inst.start()
            except Exception as exc:  # keep trying: a restart task must not die quietly
                reason = exc.message if isinstance(exc, ServerError) else repr(exc)
                log.error("restart of '%s' failed: %s", inst.instance_name, reason)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            log.info("model instance '%s' is back (pid %s)", inst.instance_name, inst.pid)
            pool.instance_back(inst)
            return

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
