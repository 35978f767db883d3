"""Triton's default scheduler: each request runs alone, on whichever instance is free."""

from shmserve.dispatch.pool import InstancePool


class DefaultScheduler:
    def __init__(self, pool: InstancePool):
        self._pool = pool

    async def submit(self, request):
        """Run one request; returns (WorkResponse, BatchTimings, instance)."""
        inst = await self._pool.acquire()
        try:
            responses, timings = await inst.execute([request])
        finally:
            self._pool.release(inst)
        return responses[0], timings, inst
