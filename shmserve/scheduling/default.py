"""Triton's default scheduler: each request runs alone, on whichever instance is free."""

import asyncio
import time

from shmserve.dispatch.pool import InstancePool


class DefaultScheduler:
    def __init__(self, pool: InstancePool, stats):
        self._pool = pool
        self._stats = stats

    async def submit(self, request, batch_size: int = 1, priority: int = 0, timeout_us: int = 0):
        """Run one request; returns (WorkResponse, BatchTimings, queue ns). The default
        scheduler has no priorities and no queue policy, so those arguments are ignored.

        A caller that is cancelled (client gone, deadline passed) leaves the batch running:
        the instance stays counted as busy until it is done, and its outputs are released.
        """
        stats = self._stats
        queued = time.monotonic_ns()
        stats.pending += 1
        try:
            inst = await self._pool.acquire()
        finally:
            stats.pending -= 1
        queue_ns = time.monotonic_ns() - queued
        pool = self._pool
        try:
            batch = asyncio.ensure_future(inst.execute([request]))
        except BaseException:
            pool.release(inst)
            raise
        batch.add_done_callback(lambda done: self._batch_done(done, inst, batch_size))
        try:
            responses, timings = await asyncio.shield(batch)
        except asyncio.CancelledError:
            batch.add_done_callback(_discard_outputs)
            raise
        return responses[0], timings, queue_ns

    def _batch_done(self, batch: asyncio.Future, inst, batch_size: int) -> None:
        if batch.cancelled() or batch.exception() is not None:
            self._pool.release(inst)
            return
        timings = batch.result()[1]
        self._pool.release(inst, timings)
        self._stats.record_execution(batch_size, timings)

    def default_bound_applies(self, work) -> bool:
        """Whether the server's default queue bound may refuse `work`: always, as there is
        no queue policy here."""
        return True

    def close(self) -> None:
        """Nothing queued here outlives the pool: waiters fail when it closes."""


def _discard_outputs(batch: asyncio.Future) -> None:
    if batch.cancelled() or batch.exception() is not None:
        return
    for response in batch.result()[0]:
        if response.release is not None:
            response.release()
