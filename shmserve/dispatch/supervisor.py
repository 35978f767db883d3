"""Restarts model instances whose process died or hung, with exponential backoff.

A hung instance is one that holds work and has sent nothing for `hang_timeout` seconds
(`--model-instance-timeout-secs`; 0 turns the check off): its handle kills it (see
WorkerHandle.detect_hangs), which makes it an instance that died.
"""

import asyncio
import logging

from shmserve.errors import ServerError

log = logging.getLogger("shmserve.dispatch")

BACKOFF_START = 0.5
BACKOFF_MAX = 30.0


class Supervisor:
    def __init__(self, hang_timeout: float = 0.0):
        self.hang_timeout = hang_timeout
        self._pools: dict = {}  # WorkerHandle -> InstancePool
        self._tasks: set = set()
        self._stopping = False

    def watch(self, pool) -> None:
        for inst in pool.instances:
            self._pools[inst] = pool
            if self.hang_timeout > 0:
                inst.detect_hangs(self.hang_timeout)
        for inst in pool.instances:
            if not inst.alive:  # died between its start and now, before anyone watched
                self.instance_exited(inst)

    def watch_instance(self, pool, inst) -> None:
        """An instance added to a serving pool (an instance group update)."""
        self._pools[inst] = pool
        if self.hang_timeout > 0:
            inst.detect_hangs(self.hang_timeout)
        if not inst.alive:
            self.instance_exited(inst)

    def forget_instance(self, inst) -> None:
        """An instance removed from its pool is being stopped: it is not restarted."""
        self._pools.pop(inst, None)

    def forget(self, pool) -> None:
        """The pool's version is being unloaded: its instances (those retiring too) are no
        longer restarted."""
        for inst in [*pool.instances, *getattr(pool, "retiring", ())]:
            if self._pools.get(inst) is pool:
                del self._pools[inst]

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
            if self._stopping or self._pools.get(inst) is not pool:
                await inst.stop()  # unloaded while it was starting
                return
            log.info("model instance '%s' is back (pid %s)", inst.instance_name, inst.pid)
            assert pool is not None  # instance_exited found it
            pool.instance_back(inst)
            return

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
