"""The one API both transports call: health, metadata, config, statistics and inference.

Requests are validated here against the model's signature, with Triton's messages, before
anything reaches a worker.
"""

import asyncio
import contextlib
import functools
import logging
import sys
import time

from shmserve import __version__, admission, eager, responses
from shmserve.admission import MAX_TENSOR_BYTE_SIZE
from shmserve.checked_templates import CheckedTemplate
from shmserve.dispatch.stream import ResponseStream
from shmserve.dispatch.worker import WorkRequest
from shmserve.errors import BackendReadError, Code, ReadError, Refused, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.extensions.response_cache import CachedResponse, ResponseCache, request_key
from shmserve.inference import InferRequest, InferResponse
from shmserve.observability import logs
from shmserve.observability.request_trace import (trace_execution, trace_request,
                                                  trace_response)
from shmserve.observability.tracing import Tracer, parse_changes
from shmserve.registry import READY, Registry
from shmserve.scheduling.queue import QueueRejection, queue_full

EXTENSIONS = ["classification", "sequence", "model_repository",
              "model_repository(unload_dependents)", "schedule_policy", "model_configuration",
              "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
              "statistics", "trace", "logging"]

log = logging.getLogger("shmserve.dataplane")


# Defaults of the limits (see docs/limits.md): each protects a server on a network and is
# well above what normal use reaches. MAX_TENSOR_BYTE_SIZE (admission.py) is one of them.
MAX_MESSAGE_SIZE = 2**31 - 1  # gRPC's ceiling (INT32_MAX), and Triton's setting
# Requests one HTTP connection or one gRPC stream has in flight; as many as the stream flow
# control allowed before it was a flag.
MAX_INFLIGHT_PER_CONNECTION = 64
# Queued requests per model with no queue policy of its own. Above any benchmark's
# concurrency, yet it keeps an open-loop flood from queueing without bound.
MAX_QUEUE_SIZE_DEFAULT = 1024
MAX_OPEN_STREAMS = 16384

class DataPlane:
    def __init__(self, registry: Registry, shared_memory: SharedMemoryManager, *,
                 server_id: str = "shmserve", strict_readiness: bool = True, models=None,
                 max_tensor_byte_size: int = MAX_TENSOR_BYTE_SIZE,
                 max_queue_size_default: int = MAX_QUEUE_SIZE_DEFAULT,
                 max_open_streams: int = MAX_OPEN_STREAMS,
                 response_cache: ResponseCache | None = None,
                 first_response_histogram: bool = False, tracer: Tracer | None = None):
        """`response_cache`: the server's (--cache-config), used by models that enable it;
        `first_response_histogram`: time each request's first response, as Triton
        does with --metrics-config histogram_latencies=true; `tracer`: the trace settings
        (--trace-config)."""
        self.registry = registry
        self.tracer = tracer or Tracer()
        self.response_cache = response_cache
        self.first_response_histogram = first_response_histogram
        self.models = models  # a repository.manager.ModelManager: the repository API
        self.shared_memory = shared_memory
        self.server_id = server_id
        self.strict_readiness = strict_readiness
        self.live = False
        self.accepting = False  # false before load and while draining
        self.stopping = False  # a stop began: not ready, though open connections are served
        self.max_tensor_byte_size = max_tensor_byte_size
        # 0 means unbounded (as Triton): stored as a number no queue reaches, so that the
        # hot path pays one integer compare either way.
        self._queue_limit = max_queue_size_default or sys.maxsize
        self.max_open_streams = max_open_streams
        self.open_streams = 0  # gRPC streams and HTTP event streams open now
        # Requests admitted and not yet answered, of every model: what a drain waits for.
        self.in_flight = 0

    # -- limits -------------------------------------------------------------------------

    def stream_opened(self) -> None:
        """A long-lived stream (gRPC ModelStreamInfer, HTTP generate_stream) opens: call
        `stream_closed()` when it ends. UNAVAILABLE when --max-open-streams are open."""
        if self.open_streams >= self.max_open_streams:
            raise ServerError(Code.UNAVAILABLE, f"the server has {self.open_streams} streams "
                                                f"open, the most it allows "
                                                f"(--max-open-streams): retry later")
        self.open_streams += 1

    def stream_closed(self) -> None:
        self.open_streams -= 1

    # -- health and metadata ------------------------------------------------------------

    def server_live(self) -> bool:
        return self.live

    def server_ready(self) -> bool:
        if not (self.live and self.accepting) or self.stopping:
            return False
        return self.registry.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict:
        return {"name": self.server_id, "version": __version__, "extensions": EXTENSIONS}

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded, every instance running, and the model's own `is_ready()` agrees where it
        has one (asked of each instance; one that does not answer in time is not ready). A
        model or version the server does not know is not ready, as in Triton: no error."""
        try:
            mv = self.registry.find(name, version)
        except ServerError as exc:
            if exc.code is Code.NOT_FOUND:
                return False
            raise  # a version that is not a number
        if mv is None or mv.state != READY:
            return False
        if mv.pool is None:
            return True
        instances = mv.pool.instances
        for inst in instances:
            if not inst.alive:
                # Triton's words, which its tests look for in the verbose log.
                log.debug("Model '%s' version %d is not ready: Stub process '%s' is not "
                          "healthy.", name, mv.version, inst.instance_name)
                return False
        hooked = [inst for inst in instances if inst.readiness_hook]
        answers = await asyncio.gather(*(inst.model_is_ready() for inst in hooked))
        for inst, ready in zip(hooked, answers):
            if not ready:
                log.debug("Model '%s' version %d is not ready: Model '%s' is not ready "
                          "(user-defined check failed).", name, mv.version, inst.instance_name)
                return False
        return True

    def model_metadata(self, name: str, version: str = "") -> dict:
        mv = self.registry.get(name, version)
        sig = mv.signature
        if version in ("", "-1"):
            versions = sorted((v.version for v in self.registry.models[name].versions.values()
                               if v.ready))
        else:
            versions = [mv.version]
        return {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": mv.platform,
            "inputs": [{"name": s.name, "datatype": s.datatype, "shape": sig.metadata_shape(s)}
                       for s in sig.inputs.values()],
            "outputs": [{"name": s.name, "datatype": s.datatype, "shape": sig.metadata_shape(s)}
                        for s in sig.outputs.values()],
        }

    def model_config(self, name: str, version: str = ""):
        """(config message, config JSON dict) of a ready version."""
        mv = self.registry.get(name, version)
        return mv.config, mv.config_json

    def model_statistics(self, name: str = "", version: str = "") -> list:
        """[(ModelVersion, ModelStats)] for one model (and version) or every ready model."""
        if name:
            # Triton answers INVALID_ARG here, not the NOT_FOUND of the other model APIs.
            rec = self.registry.models.get(name)
            versions = [v for v in rec.versions.values() if v.ready] if rec else []
            if not versions:
                raise ServerError(Code.INVALID_ARG, f"requested model '{name}' is not available")
            if version not in ("", "-1"):
                try:
                    mv = self.registry.find(name, version)
                except ServerError as exc:
                    if exc.code is not Code.NOT_FOUND:
                        raise  # a version that is not a number
                    mv = None
                if mv is None or not mv.ready:
                    raise ServerError(Code.INVALID_ARG, f"requested model version is not "
                                                        f"available for model '{name}'")
                versions = [mv]
        else:
            versions = [v for v in self.registry.all_versions() if v.ready]
        return [(mv, mv.stats) for mv in sorted(versions, key=lambda v: (v.name, v.version))]

    def repository_index(self, ready_only: bool = False, repository: str = "") -> list:
        """Every model of the repository; one that was never loaded by name only."""
        _check_repository(repository)
        out = []
        names = self.models.repository_names() if self.models is not None else sorted(
            self.registry.models)
        for name in names:
            rec = self.registry.models.get(name)
            if rec is None or (not rec.reason and not rec.versions):
                if not ready_only:
                    out.append({"name": name})
                continue
            if rec.reason and not rec.versions:
                if not ready_only:
                    out.extend({"name": rec.name, "version": str(version), "state": "UNAVAILABLE",
                                "reason": rec.reason} for version in rec.reason_versions)
                    if not rec.reason_versions:
                        out.append({"name": rec.name, "state": "UNAVAILABLE",
                                    "reason": rec.reason})
                continue
            for mv in sorted(rec.versions.values(), key=lambda v: v.version):
                if ready_only and not mv.ready:
                    continue
                entry = {"name": rec.name, "version": str(mv.version), "state": mv.state}
                if mv.reason:
                    entry["reason"] = mv.reason
                out.append(entry)
        return out

    async def load_model(self, name: str, config=None, files=None, repository: str = "") -> None:
        """The repository load API: returns once `name` is loaded (see ModelManager.load)."""
        _check_repository(repository)
        await self.models.load(name, config, files)

    async def unload_model(self, name: str, unload_dependents: bool = False,
                           repository: str = "") -> None:
        _check_repository(repository)
        await self.models.unload(name, unload_dependents)

    # -- logging ------------------------------------------------------------------------

    def log_settings(self) -> dict:
        return logs.SETTINGS.as_dict()

    def update_log_settings(self, changes: dict) -> dict:
        """Change some log settings (see logs.update); the settings after the change."""
        return logs.update(changes)

    # -- tracing ------------------------------------------------------------------------

    def trace_settings(self, model: str = "") -> dict:
        self._check_traced_model(model)
        return self.tracer.settings(model)

    def update_trace_settings(self, model: str, changes: dict) -> dict:
        """`changes`: {setting: list of strings, or None to clear} (see
        observability/tracing.py)."""
        self._check_traced_model(model)
        return self.tracer.update(model, parse_changes(changes))

    def _check_traced_model(self, model: str) -> None:
        if model and model not in self.registry.models:
            raise ServerError(Code.INVALID_ARG, f"Request for unknown model : {model}")

    # -- inference ----------------------------------------------------------------------

    def signature(self, name: str, version: str = ""):
        return self.registry.get(name, version).signature

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return self.registry.get(name, version).decoupled

    async def infer(self, request: InferRequest) -> InferResponse:
        """One request, one response: models that are not decoupled."""
        mv = self._model(request)
        if mv.decoupled:
            raise DecoupledModel(Code.UNSUPPORTED, f"model '{mv.name}' uses the decoupled "
                                                   f"transaction policy: use a streaming API")
        work, batch_size, priority, timeout_us, started = self._admit(request, mv)
        answer = request.answer
        if answer is not None and work.trace is None and mv.answers_in_worker \
                and answer.model_version == str(mv.version):
            work.answer = answer
        key = None
        # Requests with tensors in shared memory are not cached: a client may rewrite a
        # region between requests that look the same.
        if self.response_cache is not None and mv.config.response_cache.enable \
                and not work.regions:
            key, hit = self._cache_lookup(request, mv, work, started)
            if hit is not None:
                if work.trace is not None:
                    now = time.perf_counter_ns()
                    work.trace.stamp("INFER_RESPONSE_COMPLETE", now)
                    work.trace.stamp("REQUEST_END", now)
                    hit.trace = work.trace
                    asyncio.get_running_loop().call_soon(work.trace.finish)
                return hit
        mv.stats.inflight += 1
        self.in_flight += 1
        _hold_regions(work)
        try:
            response, _, _ = await self._run(mv, work, batch_size, priority, timeout_us, started)
        finally:
            mv.stats.inflight -= 1
            self.in_flight -= 1
            _release_regions(work)
            if work.trace is not None:
                # Written after the caller's turn, which may add when it sent the response.
                asyncio.get_running_loop().call_soon(work.trace.finish)
        response = responses.infer_response(request, mv, response)
        response.trace = work.trace
        if key is not None:
            self._cache_insert(key, mv, response)
        return response

    def _cache_lookup(self, request: InferRequest, mv, work, started: int) -> tuple:
        """(the request's cache key, the cached response or None)."""
        looked = time.perf_counter_ns()
        classes = responses.classifications(request) if request.outputs else None
        asked = work.requested_outputs if not classes else [
            f"{name}:{classes.get(name, 0)}" for name in work.requested_outputs]
        key = request_key(mv.name, mv.version, work.inputs, asked)
        hit = self.response_cache.lookup(key)
        now = time.perf_counter_ns()
        if hit is None:
            mv.stats.cache_miss.add(now - looked)  # its insertion's time comes later
            return key, None
        mv.stats.record_cache_hit(now - started, now - looked)
        return key, responses.cached_response(request, mv, hit)

    def _cache_insert(self, key: bytes, mv, response: InferResponse) -> None:
        inserting = time.perf_counter_ns()
        self.response_cache.insert(key, CachedResponse(
            [(o.name, o.datatype, list(o.shape), bytes(o.data)) for o in response.outputs],
            dict(response.parameters)))
        mv.stats.cache_miss.add(time.perf_counter_ns() - inserting, count=0)

    async def stream(self, request: InferRequest):
        """The responses of one request, as an async iterator of StreamedResponse, for any model
        (one that is not decoupled gives exactly one, final). Failures before the first
        response (validation, a full queue, ...) raise ServerError.

        Asking for the next response tells the worker the previous one was consumed, which is
        what bounds a slow reader's buffer; leaving the iteration early cancels the request.
        Use it with `contextlib.aclosing` so that leaving early takes effect at once.
        """
        mv = self._model(request)
        admitted = self._admit(request, mv)
        async with contextlib.aclosing(self._responses(mv, request, *admitted)) as items:
            async for response, final in items:
                yield responses.streamed(request, mv, response, final)

    async def run_step(self, request: InferRequest, output_regions: dict, timings,
                       device_outputs: tuple = ()):
        """One step of an ensemble (scheduling/ensemble.py), run and counted as a request made
        directly to its model, looked up now (a reloaded model serves the next step): an async
        iterator of (WorkResponse or None, final), whose outputs stay where the instance put
        them. Inputs may be RegionSlices (of a client's region, or of another instance's
        output arena) or DeviceTensors; the outputs named in `output_regions` are written into
        those slices, and those in `device_outputs` kept on the GPU if they were made there.
        The step's compute times are added to `timings` (a BatchTimings)."""
        mv = self.registry.get(request.model_name, request.model_version)
        if request.trace is not None:  # the ensemble's: the step's trace is its child
            request.trace = self.tracer.child(request.trace)
        work, *admitted = self._admit(request, mv, sample=False)
        for name, piece in output_regions.items():
            work.output_regions[name] = piece
            work.regions.append(piece.region)
        work.device_outputs = device_outputs
        async with contextlib.aclosing(self._responses(mv, request, work, *admitted,
                                                       timings=timings)) as items:
            async for item in items:
                yield item

    async def _responses(self, mv, request, work, batch_size, priority, timeout_us, started,
                         timings=None):
        """(WorkResponse or None, final) of an admitted request, which counts as in flight
        until its last response, so that a draining server waits for whole streams. The
        compute times of a request that is not decoupled are added to `timings`, if given."""
        mv.stats.inflight += 1
        self.in_flight += 1
        _hold_regions(work)
        try:
            if mv.decoupled:
                async with contextlib.aclosing(self._stream_decoupled(
                        mv, request, work, batch_size, priority, timeout_us, started)) as items:
                    async for item in items:
                        yield item
            else:
                response, _, step = await self._run(mv, work, batch_size, priority, timeout_us,
                                                    started)
                if timings is not None:
                    timings.compute_input_ns += step.compute_input_ns
                    timings.compute_infer_ns += step.compute_infer_ns
                    timings.compute_output_ns += step.compute_output_ns
                yield response, True
        finally:
            mv.stats.inflight -= 1
            self.in_flight -= 1
            _release_regions(work)
            if work.trace is not None and not mv.decoupled:
                work.trace.finish()

    async def _stream_decoupled(self, mv, request, work, batch_size, priority, timeout_us,
                                started):
        loop = asyncio.get_running_loop()
        stream = work.stream = ResponseStream(loop, lone=self.in_flight == 1)
        if mv.pool is not None:  # an ensemble's stream has no row to tell its steps through
            request.ask_cancel = stream.ask_cancel
        # Started now: the request reaches its scheduler in this turn of the loop.
        run = eager.start(self._run(mv, work, batch_size, priority, timeout_us, started), loop)
        run.add_done_callback(functools.partial(_end_of_execution, stream))
        stats = mv.stats
        failed = False
        first = self.first_response_histogram
        try:
            while True:
                try:
                    response, final = await stream.get()
                except ServerError:
                    failed = True
                    raise
                if first:
                    first = False
                    stats.record_first_response(time.perf_counter_ns() - started)
                if work.trace is not None:
                    trace_response(work.trace, response)
                    if final:
                        work.trace.stamp("REQUEST_END", time.perf_counter_ns())
                if response is not None and response.error is not None:
                    # An error the model sent as its answer leaves the request a success.
                    failed = failed or (final and not response.error.answered)
                    _log_failure(logging.WARNING, mv, request.id, response.error)
                yield response, final
                if final:
                    break
                stream.consumed()
        finally:
            if not stream.finished:
                stream.cancel()
                run.cancel()
                stats.record_failure(time.perf_counter_ns() - started, "CANCELED")
            else:
                # The final response may come before the end of its batch's execution.
                record = functools.partial(_record_stream, stats, batch_size, started,
                                           time.perf_counter_ns(), failed)
                if run.done():
                    record(run)
                else:
                    run.add_done_callback(record)
            if work.trace is not None:
                # Written once the execution ended too, with its compute times.
                if run.done():
                    work.trace.finish()
                else:
                    run.add_done_callback(lambda _: work.trace.finish())

    def _model(self, request: InferRequest):
        if not self.accepting:
            raise ServerError(Code.UNAVAILABLE, "Server not ready")
        return self.registry.get(request.model_name, request.model_version)

    def _admit(self, request: InferRequest, mv, sample: bool = True):
        """Validate a request: (work, batch size, priority, timeout, start time). A request
        the tracer samples (or that came with a trace) gets its trace started."""
        started = time.perf_counter_ns()
        params = request.parameters
        if sample and not request.bls and self.tracer.on:
            request.trace = self.tracer.start(mv.name, request.traceparent)
        if request.trace is not None:
            trace_request(request.trace, request, mv, started)
        template = request.template
        checked = template.checked if template is not None else None
        if checked is not None:
            work = checked.work(request, mv)
            if work is not None:
                work.trace = request.trace
                work.timeout_us = checked.timeout_us
                return work, checked.batch_size, checked.priority, checked.timeout_us, started
        try:
            work, batch_size = admission.prepare(request, mv, self.shared_memory,
                                                 self.max_tensor_byte_size)
            priority = admission.uint_parameter(params, "priority")
            timeout_us = admission.uint_parameter(params, "timeout")
            if template is not None:
                template.checked = CheckedTemplate.of(request, mv, work, batch_size, priority,
                                                      timeout_us)
        except ServerError as exc:
            if request.trace is not None:
                request.trace.stamp("REQUEST_END", time.perf_counter_ns())
                request.trace.finish()
            # Not counted in the model's statistics or metrics: Triton counts only requests
            # that reach its scheduler, and those its backend could not read.
            if isinstance(exc, BackendReadError):
                mv.stats.record_failure(time.perf_counter_ns() - started, "BACKEND")
            _log_failure(logging.DEBUG, mv, request.id, exc)
            if isinstance(exc, ReadError):
                raise
            # Triton names the request in validation errors.
            raise ServerError(exc.code, f"[request id: {request.id or '<id_unknown>'}] "
                                        f"{exc.message}") from None
        work.trace = request.trace
        work.timeout_us = timeout_us
        return work, batch_size, priority, timeout_us, started

    async def _run(self, mv, work, batch_size, priority, timeout_us, started):
        """Schedule one request until its batch ran: (WorkResponse, queue ns, timings). A
        request that is not decoupled is counted here; a decoupled one when its stream ends."""
        stats = mv.stats
        trace = work.trace
        try:
            try:
                if trace is not None:
                    trace.stamp("QUEUE_START", time.perf_counter_ns())
                if stats.pending >= self._queue_limit and \
                        mv.scheduler.default_bound_applies(work):
                    raise queue_full()
                response, timings, queue_ns = await mv.scheduler.submit(work, batch_size,
                                                                        priority, timeout_us)
            except BaseException:
                if trace is not None:
                    trace.stamp("REQUEST_END", time.perf_counter_ns())
                raise
            if trace is not None:
                trace_execution(trace, timings, None if work.stream else response)
        except Refused:
            raise
        except QueueRejection as exc:
            stats.record_failure(time.perf_counter_ns() - started, "REJECTED")
            _log_failure(logging.DEBUG, mv, work.request_id, exc)
            raise
        except ServerError as exc:
            stats.record_failure(time.perf_counter_ns() - started, "OTHER")
            _log_failure(logging.WARNING, mv, work.request_id, exc)
            raise
        except asyncio.CancelledError:
            if work.stream is None:
                work.cancel()  # a worker that holds it tells the model
                stats.record_failure(time.perf_counter_ns() - started, "CANCELED")
            raise
        if work.stream is None:
            error = response.error
            if error is not None and not error.answered:
                stats.record_failure(time.perf_counter_ns() - started, "BACKEND",
                                     timings.gpu_uuid)
                _log_failure(logging.WARNING, mv, work.request_id, error)
                raise error
            request_ns = time.perf_counter_ns() - started
            stats.record_success(batch_size=batch_size, request_ns=request_ns,
                                 queue_ns=queue_ns, compute_input_ns=timings.compute_input_ns,
                                 compute_infer_ns=timings.compute_infer_ns,
                                 compute_output_ns=timings.compute_output_ns,
                                 device=timings.gpu_uuid)
            if self.first_response_histogram:  # the only response (Triton since 2.65)
                stats.record_first_response(request_ns)
            if error is not None:
                # The model answered with an error: Triton counts the request a success.
                _log_failure(logging.WARNING, mv, work.request_id, error)
                raise error
        return response, queue_ns, timings


def _log_failure(level: int, mv, request_id: str, error: ServerError) -> None:
    """Failed requests are logged (rejected ones only at the verbose level: a client that
    sends bad requests or overruns a queue must not flood the log)."""
    log.log(level, "request failed: %s", error.message,
            extra=logs.context(model=mv.name, version=mv.version, request_id=request_id))


def _check_repository(repository: str) -> None:
    if repository:
        raise ServerError(Code.UNSUPPORTED, "'repository_name' specification is not supported")


class DecoupledModel(ServerError):
    """A one-response API was asked of a decoupled model; each transport words it its way."""


def _record_stream(stats, batch_size: int, started: int, ended: int, failed: bool,
                   run: asyncio.Future) -> None:
    """Count a decoupled request once it has its final response and its batch has run (a
    batch that could not run was counted as it failed)."""
    if run.cancelled() or run.exception() is not None:
        return
    _, queue_ns, timings = run.result()
    if failed:
        stats.record_failure(ended - started, "BACKEND", timings.gpu_uuid)
        return
    stats.record_success(batch_size=batch_size, request_ns=ended - started, queue_ns=queue_ns,
                         compute_input_ns=timings.compute_input_ns,
                         compute_infer_ns=timings.compute_infer_ns,
                         compute_output_ns=timings.compute_output_ns,
                         device=timings.gpu_uuid)


def _end_of_execution(stream: ResponseStream, run: asyncio.Future) -> None:
    """A decoupled request whose batch could not run (rejected, instance gone) ends with why."""
    if not run.cancelled() and run.exception() is not None:
        exc = run.exception()
        stream.fail(exc if isinstance(exc, ServerError) else ServerError(Code.INTERNAL, str(exc)))


def _hold_regions(work: WorkRequest) -> None:
    """The client regions a request uses are held until it ends (see memory_regions.Region)."""
    for region in work.regions:
        region.users += 1


def _release_regions(work: WorkRequest) -> None:
    for region in work.regions:
        region.release()
