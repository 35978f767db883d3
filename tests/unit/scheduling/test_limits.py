"""The limits' logic without a server: the default queue bound, the tensor size check, the
open-stream count and which schedulers the default bound applies to."""

import asyncio
from types import SimpleNamespace

import pytest

from shmserve.admission import Admitted, check_byte_size
from shmserve.dataplane import DataPlane
from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.work_types import BatchTimings, WorkInput, WorkRequest, WorkResponse
from shmserve.errors import Code, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.inference import InputTensor
from shmserve.observability.stats import ModelStats
from shmserve.registry import Registry
from shmserve.scheduling.default import DefaultScheduler
from shmserve.scheduling.dynamic import DynamicBatcher
from shmserve.scheduling.queue import QueuePolicy, QueueRejection, RequestQueue
from shmserve.scheduling.sequence import SEQUENCE_START, SequenceBatcher


class HeldInstance:
    """Runs nothing until the test lets its batches finish."""

    instance_name = "inst_0"
    alive = True

    def __init__(self):
        self.running = []

    async def execute(self, batch):
        done = asyncio.get_running_loop().create_future()
        self.running.append(done)
        await done
        return [WorkResponse(None) for _ in batch], BatchTimings()

    def finish_all(self):
        for done in self.running:
            if not done.done():
                done.set_result(None)


def work(request_id="r", flags=0, correlation_id=0) -> WorkRequest:
    return WorkRequest(request_id, correlation_id, flags, {},
                       [WorkInput("INPUT0", "FP32", [1], b"\0" * 4)], ["OUTPUT0"])


def dataplane(**limits) -> DataPlane:
    return DataPlane(Registry(), SharedMemoryManager(gpu_count=0), **limits)


def model(scheduler, stats) -> SimpleNamespace:
    return SimpleNamespace(name="m", version=1, scheduler=scheduler, stats=stats)


@pytest.mark.parametrize("bound,expected_accepted", [(3, 1 + 3), (0, 1 + 10)])
def test_a_model_without_queue_policy_sheds_past_the_default_bound(bound, expected_accepted):
    async def main():
        inst = HeldInstance()
        stats = ModelStats()
        mv = model(DefaultScheduler(InstancePool([inst], depth=1), stats), stats)
        dp = dataplane(max_queue_size_default=bound)
        calls = [asyncio.ensure_future(dp.lifecycle.run(mv, Admitted(work(f"r{i}"), 1, 0, 0, 0)))
                 for i in range(1 + 10)]
        await asyncio.sleep(0.01)
        rejected = [c for c in calls if c.done()]
        for c in rejected:
            assert isinstance(c.exception(), QueueRejection)
            assert c.exception().code is Code.UNAVAILABLE
            assert c.exception().message == "Exceeds maximum queue size"
        while inst.running and not all(c.done() for c in calls):
            inst.finish_all()
            await asyncio.sleep(0.01)
        accepted = [c for c in calls if c.exception() is None]
        assert len(accepted) == expected_accepted
        assert len(rejected) == 11 - expected_accepted
        assert stats.pending == 0
        # Once the queue drained, requests are accepted again.
        again = asyncio.ensure_future(dp.lifecycle.run(mv, Admitted(work("again"), 1, 0, 0, 0)))
        await asyncio.sleep(0.01)
        inst.finish_all()
        await again
    asyncio.run(main())


def test_the_default_bound_applies_only_where_the_config_sets_none():
    pool = InstancePool([HeldInstance()])
    stats = ModelStats()
    assert DefaultScheduler(pool, stats).default_bound_applies(work())
    unbounded = DynamicBatcher(InstancePool([HeldInstance()]), stats, max_batch_size=4)
    assert unbounded.default_bound_applies(work())
    bounded = DynamicBatcher(InstancePool([HeldInstance()]), stats, max_batch_size=4,
                             queue=RequestQueue(2, 1, QueuePolicy(), {2: QueuePolicy(max_queue_size=5)}))
    assert not bounded.default_bound_applies(work())
    sequences = SequenceBatcher(InstancePool([HeldInstance()]), stats, model_name="s",
                                max_batch_size=1, slots_per_instance=1)
    assert sequences.default_bound_applies(work(flags=SEQUENCE_START, correlation_id=7))
    assert not sequences.default_bound_applies(work(correlation_id=7))  # mid-sequence


def test_a_tensor_is_measured_by_its_shape_before_its_data():
    # The shape claims 4 TB; the data is 4 bytes: the limit speaks first.
    t = InputTensor("INPUT0", "FP32", [10**12], b"\0" * 4)
    with pytest.raises(ServerError) as e:
        check_byte_size(t, t.data, "m", 1024)
    assert e.value.code is Code.INVALID_ARG
    assert "--max-tensor-byte-size" in e.value.message and "4000000000000 bytes" in e.value.message
    ok = InputTensor("INPUT0", "FP32", [256], b"\0" * 1024)
    check_byte_size(ok, ok.data, "m", 1024)  # exactly at the limit
    strings = InputTensor("S", "BYTES", [1], b"\x05\0\0\0hello" * 1)
    with pytest.raises(ServerError):
        check_byte_size(strings, strings.data, "m", 8)
    check_byte_size(strings, strings.data, "m", 9)


def test_open_streams_are_counted_and_capped():
    dp = dataplane(max_open_streams=2)
    dp.stream_opened()
    dp.stream_opened()
    with pytest.raises(ServerError) as e:
        dp.stream_opened()
    assert e.value.code is Code.UNAVAILABLE and "--max-open-streams" in e.value.message
    dp.stream_closed()
    dp.stream_opened()
    assert dp.open_streams == 2
