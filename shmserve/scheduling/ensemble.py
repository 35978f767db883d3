"""Ensembles (`platform: "ensemble"`): a DAG of steps, each a request to another model, run by
the front.

`EnsemblePlan.build` (scheduling/ensemble_plan.py) validates the steps once, at load (Triton's
messages), and keeps what a request needs. `EnsembleScheduler.submit` runs one request: a step starts as soon as every
ensemble tensor it maps has a value, and each value goes to the steps that use it and, for an
ensemble output, into the response.

Intermediate tensors travel by reference: a step's output in its instance's output arena is
handed to the next step as a RegionSlice of that arena (WorkResponse.arena), which the next
instance maps and reads in place; the front never copies it. An intermediate that only steps on
GPU instances read, and that a GPU instance made on its GPU, stays there: it travels as a
DeviceTensor (see workers/device_tensors.py). The arena slots, and the device arrays, go back
once every step (and the response) that uses any output of that step response is done. Outputs
small enough to come back inline travel inline again.

A decoupled step feeds its downstream steps once per response: values are numbered per tensor
(iteration 0, 1, ...), and a step runs for iteration i once all its inputs have an i-th value,
as in Triton. Such an ensemble is decoupled itself: each complete set of requested outputs is
one response on the request's ResponseStream, and the final flag comes alone once no step is
left. The first step that fails fails the request with its message ("in ensemble 'name', ..."),
and the steps still running are cancelled.

Steps run through an injected `run_step(request, output_regions, timings, device_outputs)`
(the dataplane's), which looks the step's model up at request time (so a reloaded model serves
the next request), validates and counts it as a direct request to that model, and yields
(WorkResponse, final).
"""

import asyncio
import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Callable, Optional

from shmserve.config.normalize import ENSEMBLE_PLATFORM
from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.dispatch.work_types import BatchTimings, WorkOutput, WorkResponse
from shmserve.errors import Code, ModelError, ServerError
from shmserve.inference import InferRequest, InputTensor, RequestedOutput
from shmserve.ipc import datatypes
from shmserve.scheduling.ensemble_plan import EnsemblePlan, Step, dims_agree

__all__ = ["ENSEMBLE_PLATFORM", "EnsemblePlan", "EnsembleScheduler"]



class EnsembleScheduler:
    def __init__(self, plan: EnsemblePlan, run_step: Callable, stats):
        self.plan = plan
        self._run_step = run_step
        self._stats = stats
        # Triton's max_inflight_requests: at most that many requests at each step, across
        # requests; a producer waits for room before it hands a value on.
        self._limits = ([asyncio.Semaphore(plan.max_inflight) for _ in plan.steps]
                        if plan.max_inflight > 0 else None)
        self._closed = False

    @property
    def composing_models(self) -> frozenset:
        return self.plan.composing_models

    def default_bound_applies(self, work) -> bool:
        """An ensemble queues nothing itself (its pending count stays 0); each step is bounded
        at its own model."""
        return False

    async def submit(self, work, batch_size: int = 1, priority: int = 0, timeout_us: int = 0):
        """Run one request through the steps: (WorkResponse, BatchTimings, queue ns). The
        timings add up the compute times of its steps; its queue time is until its first
        step starts (as Triton counts an ensemble's). A decoupled ensemble's responses go to
        `work.stream`; the WorkResponse returned is then empty."""
        if self._closed:
            raise ServerError(Code.UNAVAILABLE, f"ensemble '{self.plan.name}' is unloading")
        submitted = time.perf_counter_ns()
        run = _Run(self.plan, self._run_step, self._limits, work, batch_size, priority,
                   timeout_us)
        response = await run.execute()
        self._stats.record_execution(batch_size, run.timings)
        return response, run.timings, max(0, run.first_step_ns - submitted)

    def close(self) -> None:
        self._closed = True


class _Held:
    """A step response whose outputs are in use: its output-arena slots go back when the
    last user (a value not yet handed on, a step reading it, the response) is done."""

    __slots__ = ("release", "users")

    def __init__(self, release):
        self.release = release
        self.users = 1  # the caller's, until it has handed the outputs out

    def drop(self) -> None:
        self.users -= 1
        if self.users == 0:
            release, self.release = self.release, None
            release()


@dataclass(slots=True)
class _Value:
    datatype: str
    shape: list
    data: object  # bytes or memoryview, b"" for an output in a client's region, None: absent
    # Where a next step reads it in place, if not inline: a RegionSlice or a DeviceTensor.
    ref: Optional[object]
    batch_size: int  # 0 when it comes from a model that does not batch
    held: Optional[_Held]
    uses: int = 0  # steps (and the response) that still have to take it


class _Run:
    """One request through the ensemble."""

    def __init__(self, plan: EnsemblePlan, run_step, limits, work, batch_size: int,
                 priority: int, timeout_us: int):
        self.plan = plan
        self.run_step = run_step
        self.limits = limits
        self.work = work
        self.batch_size = batch_size
        self.requested = tuple(work.requested_outputs)
        self.needed, self.uses = plan.pruned(self.requested)
        self.values: dict = {}  # tensor -> {iteration: _Value}
        self.counts: dict = {}  # tensor -> values it has had
        self.launched: set = set()  # (step index, iteration)
        self.tasks: set = set()
        self.starting = True  # steps that end while the first ones start do not end it
        self.timings = BatchTimings()
        self.first_step_ns = 0  # when the first step's request was made
        self.done = asyncio.get_running_loop().create_future()
        # Ensemble outputs the client wants in its region are written there by their step.
        self.regions: dict = {}  # step index -> {model output: RegionSlice}
        for tensor, piece in work.output_regions.items():
            step = plan.steps[plan.producer[tensor]]
            model_output = next(o for o, t in step.output_map.items() if t == tensor)
            self.regions.setdefault(step.index, {})[model_output] = piece
        self.parameters = _step_parameters(work, priority, timeout_us)

    async def execute(self) -> WorkResponse:
        try:
            given = {t.name: t for t in self.work.inputs}
            updated = []
            batch = self.batch_size if self.plan.batching else 0
            for name in self.plan.inputs:
                t = given.get(name)
                value = (_Value(t.datatype, t.shape, t.data, _as_ref(t.data), batch, None)
                         if t is not None else _absent())
                updated.append((name, self._put(name, value)))
            await self._advance(updated)
            self.starting = False
            if not self.tasks:
                self._finish()
            return await self.done
        except BaseException:
            self._abort()
            raise

    def _put(self, tensor: str, value: _Value) -> int:
        iteration = self.counts.get(tensor, 0)
        self.counts[tensor] = iteration + 1
        value.uses = self.uses.get(tensor, 0)
        if value.uses:
            self.values.setdefault(tensor, {})[iteration] = value
            if value.held is not None:
                value.held.users += 1
        return iteration

    async def _advance(self, updated: list) -> None:
        """Start the steps that the values just put made ready; answer when a decoupled
        ensemble has a complete set of outputs."""
        steps = self.plan.steps
        values = self.values
        ready = []
        for tensor, iteration in updated:
            for index in self.plan.consumers.get(tensor, ()):
                if index not in self.needed or (index, iteration) in self.launched:
                    continue
                if all(iteration in values.get(t, ()) for t in steps[index].input_map.values()):
                    self.launched.add((index, iteration))
                    ready.append((index, iteration))
        for index, iteration in ready:
            await self._launch(steps[index], iteration)
        if self.work.stream is not None:
            for tensor, iteration in updated:
                if tensor in self.requested and self._complete(iteration):
                    self.work.stream.push(self._response(iteration), False)

    def _take(self, tensor: str, iteration: int) -> _Value:
        """A value for one of its users; it leaves the table with the last one."""
        per = self.values[tensor]
        value = per[iteration]
        value.uses -= 1
        if value.uses == 0:
            del per[iteration]
            if value.held is not None:
                value.held.drop()
        return value

    async def _launch(self, step: Step, iteration: int) -> None:
        values = {t: self.values[t][iteration] for t in step.input_map.values()}
        held = []
        for value in values.values():
            if value.held is not None and value.held not in held:
                value.held.users += 1
                held.append(value.held)
        for tensor in values:
            self._take(tensor, iteration)
        inputs = []
        batch = 0
        for model_input, tensor in step.input_map.items():
            value = values[tensor]
            if value.data is None:
                continue  # an optional ensemble input the request left out
            shape = _fit_shape(value.shape, value.batch_size, step.batching,
                               step.input_dims[model_input])
            if step.batching and not batch and shape:
                batch = shape[0]
            inputs.append(InputTensor(model_input, value.datatype, shape,
                                      value.ref if value.ref is not None else value.data))
        limit = self.limits[step.index] if self.limits is not None else None
        if limit is not None:
            try:
                await limit.acquire()
            except BaseException:
                _drop_all(held)
                raise
        if not self.first_step_ns:
            self.first_step_ns = time.perf_counter_ns()
        request = InferRequest(step.model_name, step.model_version, self.work.request_id,
                               self.parameters, inputs,
                               [RequestedOutput(name) for name in step.output_map],
                               trace=self.work.trace)
        task = asyncio.ensure_future(self._step(step, request, batch, held, limit))
        self.tasks.add(task)
        task.add_done_callback(self._step_done)

    async def _step(self, step: Step, request, batch: int, held: list, limit) -> None:
        try:
            responses = self.run_step(request, self.regions.get(step.index, {}), self.timings,
                                      step.device_outputs)
            async with contextlib.aclosing(responses):
                async for response, _ in responses:
                    if response is None:
                        continue
                    if response.error is not None or self.done.done():
                        _release(response)
                        if response.error is not None:
                            raise response.error
                        continue
                    await self._consume(step, response, batch)
        except ServerError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug must fail the request, not leave it waiting
            self._fail(ServerError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"))
        finally:
            _drop_all(held)
            if limit is not None:
                limit.release()

    async def _consume(self, step: Step, response: WorkResponse, batch: int) -> None:
        held = _Held(response.release) if response.release is not None else None
        try:
            updated = []
            targets = self.regions.get(step.index)
            for o in response.outputs:
                tensor = step.output_map.get(o.name)
                if tensor is None:
                    continue
                if o.device is not None:
                    ref = o.device
                elif o.offset >= 0:
                    assert response.arena is not None  # an output in an arena comes with it
                    ref = RegionSlice(response.arena, o.offset, len(o.data))
                elif targets and o.name in targets:
                    ref = _written(targets[o.name], o, tensor)
                else:
                    ref = None
                value = _Value(o.datatype, o.shape, o.data, ref,
                               batch if step.batching else 0, held)
                updated.append((tensor, self._put(tensor, value)))
            if not step.decoupled:
                # As in Triton, a step's outputs are all there once it has answered: one its
                # response left out is absent, the steps reading it run without it (and the
                # model says what it misses), and the ensemble answers without it.
                produced = {tensor for tensor, _ in updated}
                for tensor in step.output_map.values():
                    if tensor not in produced:
                        updated.append((tensor, self._put(tensor, _absent())))
        finally:
            if held is not None:
                held.drop()
        await self._advance(updated)

    def _step_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not self.tasks and not self.starting:
            self._finish()

    def _complete(self, iteration: int) -> bool:
        return all(iteration in self.values.get(t, ()) for t in self.requested)

    def _response(self, iteration: int) -> WorkResponse:
        outputs = []
        held = []
        for name in self.requested:
            value = self.values[name][iteration]
            if value.held is not None and value.held not in held:
                value.held.users += 1
                held.append(value.held)
            self._take(name, iteration)
            if value.data is None:
                continue
            shape = _fit_shape(value.shape, value.batch_size, self.plan.batching,
                               self.plan.output_dims[name])
            outputs.append(WorkOutput(name, value.datatype, shape, value.data))
        release = functools.partial(_drop_all, held) if held else None
        # Triton's ensemble puts the request's sequence fields on every response with outputs.
        parameters = _sequence_parameters(self.work) if outputs else {}
        return WorkResponse(None, outputs, parameters, release=release)

    def _finish(self) -> None:
        """No step is left: answer (or end the stream) unless the request ended already."""
        if self.done.done():
            return
        if self.work.stream is not None:
            self.work.stream.push(None, True)
            self.done.set_result(WorkResponse(None))
        elif self._complete(0):
            self.done.set_result(self._response(0))
        else:
            self.done.set_exception(ModelError(
                Code.INVALID_ARG, f"in ensemble '{self.plan.name}', unexpected deadlock, at "
                                  f"least one output is not set while no more ensemble steps "
                                  f"can be made"))
        self._clear()

    def _fail(self, error: ServerError) -> None:
        if self.done.done():
            return
        self.done.set_exception(ModelError(error.code, f"in ensemble '{self.plan.name}', "
                                                       f"{error.message}"))
        self._abort()

    def _abort(self) -> None:
        """The request ended early (a step failed, or its caller gave up): the steps still
        running are cancelled, and every value let go."""
        if not self.done.done():
            self.done.cancel()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self._clear()

    def _clear(self) -> None:
        values, self.values = self.values, {}
        for per in values.values():
            for value in per.values():
                if value.held is not None:
                    value.held.drop()


def _step_parameters(work, priority: int, timeout_us: int) -> dict:
    """What each step's request carries of the ensemble's: its parameters, sequence and
    scheduling options (Triton passes them all on)."""
    params = dict(work.parameters)
    if work.correlation_id:
        params["sequence_id"] = work.correlation_id
    if work.flags & _SEQUENCE_START:
        params["sequence_start"] = True
    if work.flags & _SEQUENCE_END:
        params["sequence_end"] = True
    if priority:
        params["priority"] = priority
    if timeout_us:
        params["timeout"] = timeout_us
    return params


def _sequence_parameters(work) -> dict:
    return {"sequence_id": work.correlation_id or 0,
            "sequence_start": bool(work.flags & _SEQUENCE_START),
            "sequence_end": bool(work.flags & _SEQUENCE_END)}


def _absent() -> _Value:
    """A tensor that has no value: an optional input the request left out, or an output a
    step did not give."""
    return _Value("", [], None, None, 0, None)


# The request flags of admission.SEQUENCE_START / SEQUENCE_END.
_SEQUENCE_START = 1
_SEQUENCE_END = 2


def _as_ref(data) -> Optional[RegionSlice]:
    return data if type(data) is RegionSlice else None


def _written(target: RegionSlice, output: WorkOutput, tensor: str) -> RegionSlice:
    """The part of a client's region that a step wrote an output into, for the steps that
    read that output too."""
    if output.datatype == "BYTES":
        raise ServerError(Code.UNSUPPORTED, f"ensemble tensor '{tensor}' is a BYTES output the "
                                            f"client asked into its shared memory, and a step "
                                            f"reads it too: not supported")
    nbytes = datatypes.element_count(output.shape) * datatypes.element_size(output.datatype)
    return RegionSlice(target.region, target.offset, nbytes)


def _fit_shape(shape: list, batch_size: int, batching: bool, dims: list) -> list:
    """Triton's ReshapeTensorDims: a tensor between a batching and a non-batching model gains
    a batch dimension of 1, or loses one of 1, where its shape says it must."""
    if batching == (batch_size != 0):
        return shape
    if batching:
        if dims_agree(dims, shape):
            return [1, *shape]
    elif batch_size == 1 and not dims_agree(dims, shape):
        return shape[1:]
    return shape


def _drop_all(held: list) -> None:
    for h in held:
        h.drop()


def _release(response: WorkResponse) -> None:
    if response.release is not None:
        response.release()
