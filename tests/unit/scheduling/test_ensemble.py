"""The ensemble scheduler with fake steps: load-time validation (Triton's messages), the DAG,
intermediate tensors passed as references to the producer's output arena, the release of
those arena slots, step failures and decoupled steps."""

import asyncio

import pytest
from google.protobuf import text_format

from shmserve.dispatch.memory_regions import RegionSlice, SystemRegion
from shmserve.dispatch.stream import ResponseStream
from shmserve.dispatch.work_types import (DeviceTensor, WorkInput, WorkOutput, WorkRequest,
                                          WorkResponse)
from shmserve.errors import Code, ServerError
from shmserve.observability.stats import ModelStats
from shmserve.proto import ModelConfig
from shmserve.scheduling.ensemble import EnsemblePlan, EnsembleScheduler

ADD_SUB = """name: "add_sub" max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]"""
REPEAT = """name: "repeat" max_batch_size: 0 model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]"""
MODELS = {"add_sub": ADD_SUB, "repeat": REPEAT}

PIPELINE = """name: "pipe" platform: "ensemble" max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } },
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "DIFF" }
    output_map { key: "OUTPUT0" value: "X" } output_map { key: "OUTPUT1" value: "Y" } } ] }"""


def config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def step_config(name: str, version: int) -> ModelConfig:
    if name not in MODELS:
        raise ServerError(Code.INVALID_ARG, f"no model {name}")
    return config(MODELS[name])


def plan(text: str = PIPELINE) -> EnsemblePlan:
    return EnsemblePlan.build(config(text), step_config)


def invalid(text: str) -> str:
    with pytest.raises(ServerError) as info:
        plan(text)
    assert info.value.code == Code.INVALID_ARG
    return info.value.message


# -- validation --------------------------------------------------------------------------


def test_valid_pipeline_plan():
    p = plan()
    assert [s.model_name for s in p.steps] == ["add_sub", "add_sub"]
    assert p.producer == {"SUM": 0, "DIFF": 0, "X": 1, "Y": 1}
    assert p.consumers == {"A": (0,), "B": (0,), "SUM": (1,), "DIFF": (1,)}
    assert not p.decoupled
    assert p.composing_models == {"add_sub"}
    needed, uses = p.pruned(("SUM",))
    assert needed == {0} and uses["SUM"] == 1 and uses["DIFF"] == 0


def test_unknown_step_model_fails_with_its_reason():
    assert invalid(PIPELINE.replace('model_name: "add_sub" model_version: -1\n    input_map '
                                    '{ key: "INPUT0" value: "SUM" }',
                                    'model_name: "nope" model_version: -1\n    input_map '
                                    '{ key: "INPUT0" value: "SUM" }')) == "no model nope"


@pytest.mark.parametrize("change, message", [
    (('output_map { key: "OUTPUT0" value: "X" }', 'output_map { key: "OUTPUT0" value: "SUM" }'),
     "ensemble tensor 'SUM' can appear in an output map only once for ensemble 'pipe' step 1"),
    (('{ name: "Y" data_type', '{ name: "Z" data_type'),
     "ensemble output 'Z' for ensemble 'pipe' is not used"),
    (('input_map { key: "INPUT1" value: "DIFF" }', 'input_map { key: "INPUT1" value: "X" }'),
     "ensemble 'pipe' has a cycle: step 1 ('add_sub') -> step 1 ('add_sub')"),
    (('input_map { key: "INPUT1" value: "B" }', 'input_map { key: "INPUT1" value: "A" }'),
     "ensemble input 'B' for ensemble 'pipe' is not used"),
    (('input_map { key: "INPUT1" value: "DIFF" }', 'input_map { key: "INPUT1" value: "A" }'),
     "ensemble tensor 'DIFF' is unused in ensemble 'pipe'"),
    (('input_map { key: "INPUT1" value: "DIFF" }', 'input_map { key: "INPUTX" value: "DIFF" }'),
     "in ensemble pipe, ensemble tensor DIFF is mapping to non-existing input INPUTX in model "
     "add_sub"),
    (('output_map { key: "OUTPUT1" value: "Y" }', 'output_map { key: "OUTPUTX" value: "Y" }'),
     "in ensemble pipe, ensemble tensor Y is mapped from non-existing output OUTPUTX in model "
     "add_sub"),
    (('{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }', '{ name: "B" data_type: TYPE_INT32 '
                                                        'dims: [ 4 ] }'),
     "in ensemble pipe, ensemble tensor B: inconsistent data type: TYPE_INT32 is inferred from "
     "model pipe while TYPE_FP32 is inferred from model add_sub"),
    (('{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }', '{ name: "B" data_type: TYPE_FP32 '
                                                        'dims: [ 5 ] }'),
     "in ensemble pipe, ensemble tensor B: inconsistent shape: [5] is inferred from model pipe "
     "while [4] is inferred from model add_sub"),
    (('max_batch_size: 0', 'max_batch_size: 8'), None),
    (('ensemble_scheduling { step [', 'ensemble_scheduling { step [ { model_name: "add_sub" } ,'),
     "must specify 'input_map' in step 0 of ensemble 'pipe'"),
])
def test_invalid_ensembles(change, message):
    text = PIPELINE.replace(*change)
    assert text != PIPELINE
    if message is None:  # valid: a batching ensemble may use models that do not batch
        plan(text)
        return
    assert invalid(text) == message


def test_decoupled_step_makes_the_ensemble_decoupled():
    text = PIPELINE.replace('model_name: "add_sub" model_version: -1\n    input_map { key: '
                            '"INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }\n    '
                            'output_map { key: "OUTPUT0" value: "SUM" } output_map { key: '
                            '"OUTPUT1" value: "DIFF" }',
                            'model_name: "repeat" model_version: -1\n    input_map { key: "IN" '
                            'value: "A" }\n    output_map { key: "OUT" value: "SUM" }')
    text = text.replace('input_map { key: "INPUT1" value: "DIFF" }',
                        'input_map { key: "INPUT1" value: "B" }')
    assert "repeat" in text
    # B comes from the request, SUM from the decoupled step: they cannot be paired
    assert invalid(text) == ("in ensemble pipe, step of model 'add_sub' receives inputs "
                             "originated from different decoupled models")


# -- running -----------------------------------------------------------------------------


class FakeSteps:
    """run_step of fake models: add_sub on float32 [4] (its outputs in a fake output arena,
    one per call), repeat (one response per `repeats`), or a failure."""

    def __init__(self, repeats=1, fail=None):
        self.calls = []  # the InferRequests of the steps, in order
        self.device_outputs = []  # what each step was asked to keep on its GPU
        self.released = []  # arenas whose slots were released
        self.repeats = repeats
        self.fail = fail
        self.cancelled = 0

    async def __call__(self, request, output_regions, timings, device_outputs=()):
        self.calls.append(request)
        self.device_outputs.append(device_outputs)
        if request.model_name == "slow":
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        await asyncio.sleep(0)
        if request.model_name == self.fail:
            raise ServerError(Code.INTERNAL, "step exploded")
        timings.compute_infer_ns += 10
        if request.model_name == "repeat":
            for k in range(self.repeats):
                yield self.response(request, {"OUT": b"%d" % k}), False
            yield None, True
            return
        yield self.response(request, {"OUTPUT0": b"sum", "OUTPUT1": b"dif"},
                            device_outputs), True

    def response(self, request, outputs, device_outputs=()):
        """Outputs in a fake output arena; those named in `device_outputs` "on a GPU", as
        DeviceTensors."""
        arena = SystemRegion(f"arena{len(self.calls)}", 1 << 20, key="/x")
        outs = [WorkOutput(name, "FP32", [4], b"", device=DeviceTensor(
                    b"handle%d" % len(self.calls), 0, 64 * i, 16))
                if name in device_outputs else
                WorkOutput(name, "FP32", [4], memoryview(data), 64 * i)
                for i, (name, data) in enumerate(outputs.items())]
        return WorkResponse(None, outs, release=lambda: self.released.append(arena),
                            arena=arena)


def work(stream=None, outputs=("SUM", "X", "Y")) -> WorkRequest:
    inputs = [WorkInput("A", "FP32", [4], b"a" * 16), WorkInput("B", "FP32", [4], b"b" * 16)]
    return WorkRequest("id7", 0, 0, {"p": 1}, inputs, list(outputs), stream=stream)


def test_intermediates_reach_the_next_step_as_references():
    async def main():
        steps = FakeSteps()
        stats = ModelStats()
        scheduler = EnsembleScheduler(plan(), steps, stats)
        response, timings, queue_ns = await scheduler.submit(work())
        first, second = steps.calls
        assert first.id == "id7" and first.parameters == {"p": 1}
        assert {t.name: bytes(t.data) for t in first.inputs} == {"INPUT0": b"a" * 16,
                                                                 "INPUT1": b"b" * 16}
        # The second step reads the first one's outputs where they lie: no bytes in the front.
        refs = {t.name: t.data for t in second.inputs}
        assert all(type(r) is RegionSlice for r in refs.values())
        assert refs["INPUT0"].region.name == refs["INPUT1"].region.name == "arena1"
        assert (refs["INPUT0"].offset, refs["INPUT0"].nbytes) == (0, 3)
        assert (refs["INPUT1"].offset, refs["INPUT1"].nbytes) == (64, 3)
        assert steps.released == []  # every output of both steps is in the response
        assert {o.name: bytes(o.data) for o in response.outputs} == {
            "SUM": b"sum", "X": b"sum", "Y": b"dif"}
        response.release()
        assert sorted(r.name for r in steps.released) == ["arena1", "arena2"]
        # Its queue time is until the first step started: short, but counted (Triton does).
        assert timings.compute_infer_ns == 20 and 0 < queue_ns < 10**9
        assert stats.execution_count == 1

    asyncio.run(main())


GPU_ADD_SUB = ADD_SUB + ' instance_group [ { kind: KIND_GPU } ]'


def test_intermediates_only_gpu_steps_read_are_kept_on_the_gpu(monkeypatch):
    monkeypatch.setitem(MODELS, "add_sub", GPU_ADD_SUB)
    first, second = plan().steps
    # DIFF is read by the second step alone, on a GPU; SUM is also an ensemble output, which
    # the front sends to the client; X and Y are ensemble outputs only.
    assert (first.device_outputs, second.device_outputs) == (("OUTPUT1",), ())
    monkeypatch.setitem(MODELS, "add_sub", ADD_SUB)  # no instance group: on the CPU
    assert [s.device_outputs for s in plan().steps] == [(), ()]


def test_an_intermediate_kept_on_the_gpu_reaches_the_next_step_there(monkeypatch):
    monkeypatch.setitem(MODELS, "add_sub", GPU_ADD_SUB)

    async def main():
        steps = FakeSteps()
        response, _, _ = await EnsembleScheduler(plan(), steps, ModelStats()).submit(work())
        assert steps.device_outputs == [("OUTPUT1",), ()]
        second = {t.name: t.data for t in steps.calls[1].inputs}
        assert second["INPUT1"] == DeviceTensor(b"handle1", 0, 64, 16)
        assert type(second["INPUT0"]) is RegionSlice
        # SUM is still in the response: the first step's outputs are held until it goes.
        assert steps.released == []
        response.release()
        assert sorted(r.name for r in steps.released) == ["arena1", "arena2"]

    asyncio.run(main())


def test_only_the_steps_requested_outputs_need_run():
    async def main():
        steps = FakeSteps()
        response, _, _ = await EnsembleScheduler(plan(), steps, ModelStats()).submit(
            work(outputs=("SUM",)))
        assert len(steps.calls) == 1
        assert [o.name for o in response.outputs] == ["SUM"]
        response.release()
        assert len(steps.released) == 1

    asyncio.run(main())


def test_a_failing_step_fails_the_request_and_cancels_the_others():
    text = PIPELINE.replace('{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                            '{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] },'
                            '{ name: "Z" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    text = text.replace("} ] }", """},
      { model_name: "slow" model_version: -1 input_map { key: "INPUT0" value: "A" }
        output_map { key: "OUTPUT0" value: "Z" } } ] }""")
    MODELS["slow"] = """name: "slow" max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]"""

    async def main():
        steps = FakeSteps(fail="add_sub")
        stats = ModelStats()
        with pytest.raises(ServerError) as info:
            await EnsembleScheduler(plan(text), steps, stats).submit(
                work(outputs=("SUM", "X", "Y", "Z")))
        assert info.value.code == Code.INTERNAL
        assert info.value.message == "in ensemble 'pipe', step exploded"
        await asyncio.sleep(0)
        assert steps.cancelled == 1
        assert stats.execution_count == 0

    try:
        asyncio.run(main())
    finally:
        del MODELS["slow"]


STREAMING = """name: "pipe" platform: "ensemble" max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "A" } output_map { key: "OUT" value: "SUM" } },
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "SUM" }
    output_map { key: "OUTPUT0" value: "X" } output_map { key: "OUTPUT1" value: "Y" } } ] }"""


def test_each_response_of_a_decoupled_step_feeds_the_next_steps():
    p = plan(STREAMING)
    assert p.decoupled

    async def main():
        steps = FakeSteps(repeats=3)
        stream = ResponseStream()
        w = work(stream=stream)
        w.inputs = w.inputs[:1]
        response, _, _ = await EnsembleScheduler(p, steps, ModelStats()).submit(w)
        assert response.outputs == []
        got = []
        while True:
            item, final = await stream.get()
            if final:
                assert item is None
                break
            got.append({o.name: bytes(o.data) for o in item.outputs})
            item.release()
        assert got == [{"SUM": b"%d" % k, "X": b"sum", "Y": b"dif"} for k in range(3)]
        assert [c.model_name for c in steps.calls] == ["repeat"] + ["add_sub"] * 3
        # every second step read its own response of the first one, by reference
        assert [c.inputs[0].data.region.name for c in steps.calls[1:]] == [
            "arena1", "arena1", "arena1"]
        assert len(steps.released) == 6

    asyncio.run(main())


class GatedSteps(FakeSteps):
    """FakeSteps whose add_sub calls wait for `gate`; `most` is the most in flight at once."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gate = asyncio.Event()
        self.running = 0
        self.most = 0

    async def __call__(self, request, output_regions, timings, device_outputs=()):
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.gate.wait()
            async for item in super().__call__(request, output_regions, timings,
                                               device_outputs):
                yield item
        finally:
            self.running -= 1


def test_max_inflight_requests_is_one_limit_for_all_requests_at_each_step():
    """Triton 2.63/2.68: the requests of every client share the limit; those past it wait."""
    text = PIPELINE.replace("ensemble_scheduling {",
                            "ensemble_scheduling { max_inflight_requests: 1")

    async def main():
        steps = GatedSteps()
        scheduler = EnsembleScheduler(plan(text), steps, ModelStats())
        requests = [asyncio.ensure_future(scheduler.submit(work())) for _ in range(3)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert steps.running == 1  # one request at the first step, two waiting for room
        steps.gate.set()
        responses = await asyncio.gather(*requests)
        assert steps.most == 1 and len(steps.calls) == 6
        for response, _, _ in responses:
            response.release()

    asyncio.run(main())


def test_a_step_whose_queue_is_full_fails_the_ensemble_at_once():
    """Triton 2.66: the step's UNAVAILABLE is the ensemble's answer, instead of a hang."""
    class FullQueue(FakeSteps):
        async def __call__(self, request, output_regions, timings, device_outputs=()):
            self.calls.append(request)
            raise ServerError(Code.UNAVAILABLE, "Exceeds maximum queue size")
            yield  # an async generator, as run_step is

    async def main():
        with pytest.raises(ServerError) as info:
            await asyncio.wait_for(
                EnsembleScheduler(plan(), FullQueue(), ModelStats()).submit(work()), 5)
        assert info.value.code == Code.UNAVAILABLE
        assert info.value.message == "in ensemble 'pipe', Exceeds maximum queue size"

    asyncio.run(main())
