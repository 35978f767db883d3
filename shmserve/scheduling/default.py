"""Triton's default scheduler: each request runs alone, on whichever instance is free."""

import asyncio

from shmserve.dispatch.pool import InstancePool


class DefaultScheduler:
    def __init__(self, pool: InstancePool):
        self._pool = pool

    async def submit(self, request):
        """Run one request; returns (WorkResponse, BatchTimings).

        A caller that is cancelled (client gone, deadline passed) leaves the batch running:
        the instance stays counted as busy until it is done, and its outputs are released.
        """
        inst = await self._pool.acquire()
        pool = self._pool
        try:
            batch = asyncio.ensure_future(inst.execute([request]))
        except BaseException:
            pool.release(inst)
            raise
        batch.add_done_callback(lambda _: pool.release(inst))
        try:
            responses, timings = await asyncio.shield(batch)
        except asyncio.CancelledError:
            batch.add_done_callback(_discard_outputs)
            raise
        return responses[0], timings


def _discard_outputs(batch: asyncio.Future) -> None:
    if batch.cancelled() or batch.exception() is not None:
        return
    for response in batch.result()[0]:
        if response.release is not None:
            response.release()
