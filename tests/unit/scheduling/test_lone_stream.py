"""A decoupled request is `lone` when the front had no other request in flight as it came: the
front and its worker then poll for that one client (dispatch/front_spin.py)."""

import asyncio
from types import SimpleNamespace

from shmserve.admission import Admitted
from shmserve.dataplane import DataPlane
from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.work_types import BatchTimings, WorkInput, WorkRequest
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.observability.stats import ModelStats
from shmserve.registry import Registry
from shmserve.scheduling.default import DefaultScheduler


class StreamingInstance:
    """Notes whether each request came lone, and ends its stream when the test says."""

    instance_name = "inst_0"
    alive = True

    def __init__(self):
        self.lone = {}
        self._streams = {}

    async def execute(self, batch):
        for req in batch:
            self.lone[req.request_id] = req.stream.lone
            self._streams[req.request_id] = req.stream
        return [None] * len(batch), BatchTimings()

    def finish(self, request_id):
        self._streams.pop(request_id).push(None, True)


def work(request_id) -> WorkRequest:
    return WorkRequest(request_id, 0, 0, {}, [WorkInput("IN", "INT32", [1], b"\0" * 4)],
                       ["OUT"])


async def read_all(dp, mv, request_id):
    request = SimpleNamespace(id=request_id)
    async for _ in dp.lifecycle.responses(mv, request, Admitted(work(request_id), 1, 0, 0, 0)):
        pass


def test_a_stream_is_lone_only_while_no_other_request_is_in_flight():
    async def main():
        inst = StreamingInstance()
        stats = ModelStats()
        pool = InstancePool([inst], pipeline_below_us=0)
        mv = SimpleNamespace(name="m", version=1, decoupled=True, stats=stats, pool=pool,
                             scheduler=DefaultScheduler(pool, stats))
        dp = DataPlane(Registry(), SharedMemoryManager(gpu_count=0))
        first = asyncio.ensure_future(read_all(dp, mv, "a"))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(read_all(dp, mv, "b"))  # while "a" streams
        await asyncio.sleep(0.01)
        inst.finish("a")
        await first
        await asyncio.sleep(0.01)
        inst.finish("b")
        await second
        third = asyncio.ensure_future(read_all(dp, mv, "c"))  # alone again
        await asyncio.sleep(0.01)
        inst.finish("c")
        await third
        assert inst.lone == {"a": True, "b": False, "c": True}
        assert dp.in_flight == 0
    asyncio.run(main())
