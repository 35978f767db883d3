"""The lifecycle of an inference request in the front, once a transport decoded it and the
dataplane found its model:

    admit     check it against the model (admission.py), or by its template's check on
              record (fastpath/checked_templates.py); start its trace if the tracer samples it
    schedule  hand it to the model's scheduler, unless the default queue bound is reached
    execute   the scheduler runs it in a batch on a worker of one of the model's instances
    respond   turn the work response into the transports' InferResponse (responses.py)

On the way a request is counted in its model's statistics (a success, or a failure and why),
traced if sampled (observability/request_trace.py), answered from the response cache where
its model enables one, and counted in flight until its last response, which is what a
draining server waits for. Failed requests are logged.
"""

import asyncio
import contextlib
import functools
import logging
import sys
import time

from shmserve import admission, eager, responses
from shmserve.admission import Admitted
from shmserve.dispatch.stream import ResponseStream
from shmserve.dispatch.work_types import WorkRequest
from shmserve.errors import BackendReadError, Code, ReadError, Refused, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.extensions.response_cache import CachedResponse, ResponseCache, request_key
from shmserve.fastpath import checked_templates, prepared_answers
from shmserve.inference import InferRequest, InferResponse
from shmserve.observability import logs
from shmserve.observability.request_trace import (trace_execution, trace_request,
                                                  trace_response)
from shmserve.observability.tracing import Tracer
from shmserve.scheduling.queue import QueueRejection, queue_full

# The dataplane's logger: JSON logs name it, and a log filter may key on it.
log = logging.getLogger("shmserve.dataplane")


class Lifecycle:
    """The way of every inference request, from admission to its last response."""

    def __init__(self, shared_memory: SharedMemoryManager, tracer: Tracer, *,
                 max_tensor_byte_size: int, max_queue_size_default: int,
                 response_cache: ResponseCache | None, first_response_histogram: bool):
        """See DataPlane, which holds the settings of the same names."""
        self.shared_memory = shared_memory
        self.tracer = tracer
        self.max_tensor_byte_size = max_tensor_byte_size
        # 0 means unbounded (as Triton): stored as a number no queue reaches, so that the
        # hot path pays one integer compare either way.
        self.queue_limit = max_queue_size_default or sys.maxsize
        self.response_cache = response_cache
        self.first_response_histogram = first_response_histogram
        # Requests admitted and not yet answered, of every model: what a drain waits for.
        self.in_flight = 0

    async def infer(self, request: InferRequest, mv) -> InferResponse:
        """The one response of a request to a model that is not decoupled."""
        admitted = self.admit(request, mv)
        work = admitted.work
        if request.prepared_answer is not None:  # the fast path: the worker may write it
            work.prepared_answer = prepared_answers.for_work(request.prepared_answer, work, mv)
        key = None
        # Requests with tensors in shared memory are not cached: a client may rewrite a
        # region between requests that look the same.
        if self.response_cache is not None and mv.config.response_cache.enable \
                and not work.regions:
            key, hit = self._cache_lookup(request, mv, work, admitted.started)
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
            response, _, _ = await self.run(mv, admitted)
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

    def admit(self, request: InferRequest, mv, sample: bool = True) -> Admitted:
        """Validate a request. A request the tracer samples (or that came with a trace) gets
        its trace started."""
        started = time.perf_counter_ns()
        params = request.parameters
        if sample and not request.bls and self.tracer.on:
            request.trace = self.tracer.start(mv.name, request.traceparent)
        if request.trace is not None:
            trace_request(request.trace, request, mv, started)
        template = request.template
        if template is not None:  # the fast path's shortcut
            admitted = checked_templates.admitted(request, mv, started)
            if admitted is not None:
                return admitted
        try:
            work, batch_size = admission.prepare(request, mv, self.shared_memory,
                                                 self.max_tensor_byte_size)
            priority = admission.uint_parameter(params, "priority")
            timeout_us = admission.uint_parameter(params, "timeout")
            if template is not None:
                checked_templates.remember(request, mv, work, batch_size, priority, timeout_us)
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
        return Admitted(work, batch_size, priority, timeout_us, started)

    async def run(self, mv, admitted: Admitted):
        """Schedule one request until its batch ran: (WorkResponse, queue ns, timings). A
        request that is not decoupled is counted here; a decoupled one when its stream ends."""
        work = admitted.work
        started = admitted.started
        stats = mv.stats
        trace = work.trace
        try:
            try:
                if trace is not None:
                    trace.stamp("QUEUE_START", time.perf_counter_ns())
                if stats.pending >= self.queue_limit and \
                        mv.scheduler.default_bound_applies(work):
                    raise queue_full()
                response, timings, queue_ns = await mv.scheduler.submit(
                    work, admitted.batch_size, admitted.priority, admitted.timeout_us)
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
            stats.record_success(batch_size=admitted.batch_size, request_ns=request_ns,
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

    async def responses(self, mv, request, admitted: Admitted, timings=None):
        """(WorkResponse or None, final) of an admitted request, which counts as in flight
        until its last response, so that a draining server waits for whole streams. The
        compute times of a request that is not decoupled are added to `timings`, if given."""
        work = admitted.work
        mv.stats.inflight += 1
        self.in_flight += 1
        _hold_regions(work)
        try:
            if mv.decoupled:
                async with contextlib.aclosing(self._stream_decoupled(
                        mv, request, admitted)) as items:
                    async for item in items:
                        yield item
            else:
                response, _, step = await self.run(mv, admitted)
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

    async def _stream_decoupled(self, mv, request, admitted: Admitted):
        work = admitted.work
        started = admitted.started
        loop = asyncio.get_running_loop()
        stream = work.stream = ResponseStream(loop, lone=self.in_flight == 1)
        if mv.pool is not None:  # an ensemble's stream has no row to tell its steps through
            request.ask_cancel = stream.ask_cancel
        # Started now: the request reaches its scheduler in this turn of the loop.
        run = eager.start(self.run(mv, admitted), loop)
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
                record = functools.partial(_record_stream, stats, admitted.batch_size, started,
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


def _hold_regions(work: WorkRequest) -> None:
    """The client regions a request uses are held until it ends (see memory_regions.Region)."""
    for region in work.regions:
        region.users += 1


def _release_regions(work: WorkRequest) -> None:
    for region in work.regions:
        region.release()


def _log_failure(level: int, mv, request_id: str, error: ServerError) -> None:
    """Failed requests are logged (rejected ones only at the verbose level: a client that
    sends bad requests or overruns a queue must not flood the log)."""
    log.log(level, "request failed: %s", error.message,
            extra=logs.context(model=mv.name, version=mv.version, request_id=request_id))


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
