"""gRPC endpoints: inference.GRPCInferenceService and grpc.health.v1.Health.

Each RPC decodes, calls the dataplane, and encodes; transport.py and its connections carry
the calls. Methods are registered by path over our private-pool message classes, so no
generated stubs are needed.
"""

import asyncio
import collections
import contextlib
import logging
import time

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from shmserve import eager, proto
from shmserve.dataplane import (MAX_INFLIGHT_PER_CONNECTION, MAX_MESSAGE_SIZE, DataPlane,
                                DecoupledModel)
from shmserve.errors import Code, ModelError, ServerError
from shmserve.extensions import header_forwarding, restricted_api
from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.grpc import codec, transport
from shmserve.grpc.transport import GrpcServer, Method, RpcError
from shmserve.inference import StreamedResponse
from shmserve.observability.stats import stats_json

log = logging.getLogger("shmserve.grpc")

STATUS = {
    Code.INTERNAL: transport.INTERNAL,
    Code.NOT_FOUND: transport.NOT_FOUND,
    Code.UNAVAILABLE: transport.UNAVAILABLE,
    Code.UNSUPPORTED: transport.UNIMPLEMENTED,
    Code.INVALID_ARG: transport.INVALID_ARGUMENT,
    Code.ALREADY_EXISTS: transport.ALREADY_EXISTS,
    Code.CANCELLED: transport.CANCELLED,
    Code.UNKNOWN: transport.UNKNOWN,
}

SERVING = 1


def _rpc_error(exc: ServerError) -> RpcError:
    return RpcError(STATUS.get(exc.code, transport.UNKNOWN), exc.message)


def _unary(fn, with_context: bool = False, restriction=None):
    async def handler(request, context):
        if restriction is not None:
            _check(restriction, context)
        try:
            return await (fn(request, context) if with_context else fn(request))
        except ServerError as exc:
            raise _rpc_error(exc) from None
    return handler


def _streaming(fn, restriction):
    async def handler(requests, context):
        _check(restriction, context)
        async for response in fn(requests, context):
            yield response
    return handler


def _check(restriction: tuple, context) -> None:
    if not restricted_api.allowed(restriction, context.invocation_metadata()):
        raise RpcError(transport.UNAVAILABLE, restricted_api.refusal(restriction[0]))


# The API category (extensions/restricted_api.py) of each method; the health service's Check
# is health.
_CATEGORIES = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository", "TraceSetting": "trace",
    "LogSettings": "logging",
}


class InferenceServicer:
    def __init__(self, dataplane: DataPlane,
                 max_inflight_per_stream: int = MAX_INFLIGHT_PER_CONNECTION,
                 header_pattern=None, prepare_answers: bool = True):
        """`header_pattern`: metadata whose names it matches become request parameters
        (--grpc-header-forward-pattern; extensions/header_forwarding.py), or None.
        `prepare_answers`: models' workers may write infer answers (--worker-answers;
        fastpath/prepared_answers.py)."""
        self.dp = dataplane
        self.max_inflight_per_stream = max_inflight_per_stream
        self.header_pattern = header_pattern
        self.prepare_answers = prepare_answers

    async def ServerLive(self, request):
        return proto.ServerLiveResponse(live=self.dp.server_live())

    async def ServerReady(self, request):
        return proto.ServerReadyResponse(ready=self.dp.server_ready())

    async def ModelReady(self, request):
        return proto.ModelReadyResponse(
            ready=await self.dp.model_ready(request.name, request.version))

    async def ServerMetadata(self, request):
        return proto.ServerMetadataResponse(**self.dp.server_metadata())

    async def ModelMetadata(self, request):
        md = self.dp.model_metadata(request.name, request.version)
        resp = proto.ModelMetadataResponse(name=md["name"], versions=md["versions"],
                                           platform=md["platform"])
        for key, target in (("inputs", resp.inputs), ("outputs", resp.outputs)):
            for t in md[key]:
                target.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelConfig(self, request):
        config, _ = self.dp.model_config(request.name, request.version)
        resp = proto.ModelConfigResponse()
        resp.config.CopyFrom(config)
        return resp

    async def ModelStatistics(self, request):
        stats = self.dp.model_statistics(request.name, request.version)
        return json_format.ParseDict(
            {"model_stats": [stats_json(mv, s) for mv, s in stats]},
            proto.ModelStatisticsResponse())

    async def RepositoryIndex(self, request):
        resp = proto.RepositoryIndexResponse()
        for entry in self.dp.repository_index(request.ready, request.repository_name):
            resp.models.add(**entry)
        return resp

    async def RepositoryModelLoad(self, request):
        """`config` (string_param): a ModelConfig as JSON; `file:<version>/<name>`
        (bytes_param): a file of the model directory to load from."""
        params = request.parameters
        config = params["config"].string_param if "config" in params else None
        files = {key: value.bytes_param for key, value in params.items()
                 if key.startswith("file:")}
        await self.dp.load_model(request.model_name, config, files, request.repository_name)
        return proto.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request):
        params = request.parameters
        unload_dependents = ("unload_dependents" in params
                             and params["unload_dependents"].bool_param)
        await self.dp.unload_model(request.model_name, unload_dependents,
                                   request.repository_name)
        return proto.RepositoryModelUnloadResponse()

    async def LogSettings(self, request):
        changes = {}
        for key, value in request.settings.items():
            choice = value.WhichOneof("parameter_choice")
            # A setting with no value fails the dataplane's type check, as in Triton.
            changes[key] = getattr(value, choice) if choice else None
        settings = (self.dp.update_log_settings(changes) if changes
                    else self.dp.log_settings())
        resp = proto.LogSettingsResponse()
        for key, value in settings.items():
            entry = resp.settings[key]
            if type(value) is bool:
                entry.bool_param = value
            elif type(value) is int:
                entry.uint32_param = value
            else:
                entry.string_param = value
        return resp

    async def TraceSetting(self, request):
        # An empty value list clears a setting (tritonclient sends None that way).
        changes = {key: list(value.value) for key, value in request.settings.items()}
        model = request.model_name
        settings = (self.dp.update_trace_settings(model, changes) if changes
                    else self.dp.trace_settings(model))
        resp = proto.TraceSettingResponse()
        for key, value in settings.items():
            resp.settings[key].value.extend(value if isinstance(value, list) else [value])
        return resp

    async def SystemSharedMemoryStatus(self, request):
        return _region_statuses(proto.SystemSharedMemoryStatusResponse(),
                                self.dp.shared_memory.system_status(request.name))

    async def SystemSharedMemoryRegister(self, request):
        self.dp.shared_memory.register_system(request.name, request.key, request.offset,
                                              request.byte_size)
        return proto.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request):
        self.dp.shared_memory.unregister_system(request.name)
        return proto.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request):
        return _region_statuses(proto.CudaSharedMemoryStatusResponse(),
                                self.dp.shared_memory.cuda_status(request.name))

    async def CudaSharedMemoryRegister(self, request):
        self.dp.shared_memory.register_cuda(request.name, request.raw_handle, request.device_id,
                                            request.byte_size)
        return proto.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request):
        self.dp.shared_memory.unregister_cuda(request.name)
        return proto.CudaSharedMemoryUnregisterResponse()

    async def ModelInfer(self, wire, context):
        infer_request = codec.read_model_infer_request(wire)
        if self.header_pattern is not None:
            header_forwarding.forward(infer_request, context.invocation_metadata(),
                                      self.header_pattern)
        if self.dp.tracer.on:
            infer_request.received = (("GRPC_WAITREAD_END", time.perf_counter_ns()),)
            infer_request.traceparent = _traceparent(context)
        # The fast path: its template decides the answer up to the outputs' bytes, which the
        # model's worker may then write (fastpath/prepared_answers.py).
        loans = None
        if self.prepare_answers and not context.response_encoding:
            loans = context.conn.loans
            infer_request.prepared_answer = loans.prepared(infer_request.template, context)
        try:
            response = await self.dp.infer(infer_request)
        except DecoupledModel:
            raise ServerError(Code.UNSUPPORTED, "ModelInfer RPC doesn't support models with "
                                                "decoupled transaction policy") from None
        if response.written_by_worker:  # the fast path: the model's worker wrote it
            response.done()
            return WRITTEN_BY_WORKER
        if loans is not None:  # the fast path: this answer's layout, for the next request
            template = infer_request.template
            loans.learn(template, response.model_version,
                        codec.prepared_message(response) if template is not None else None)
        trace = response.trace
        if trace is not None:
            trace.stamp("GRPC_SEND_START", time.perf_counter_ns())
        try:
            return codec.serialize_model_infer_response(response)
        finally:
            response.done()
            if trace is not None:
                # Handed to the HTTP/2 layer, which writes it in this same turn of the loop.
                trace.stamp("GRPC_SEND_END", time.perf_counter_ns())

    async def ModelStreamInfer(self, request_iterator, context):
        """Many requests in flight on one stream. Responses of decoupled models leave as they
        come; those of other models in request order. Errors travel in-band and the stream
        stays open, unless the client asked for `triton_grpc_error` (then the RPC ends)."""
        grpc_error = any(k == "triton_grpc_error" and v.lower() == "true"
                         for k, v in context.invocation_metadata() or ())
        try:
            self.dp.stream_opened()
        except ServerError as exc:
            # UNAVAILABLE rather than RESOURCE_EXHAUSTED: it is Triton's code for "busy, retry"
            # (a full queue), and gRPC retry policies treat it as retryable.
            raise _rpc_error(exc) from None
        metadata = context.invocation_metadata() if self.header_pattern is not None else None
        stream = _Stream(self.dp, self.max_inflight_per_stream, metadata, self.header_pattern,
                         context, lambda: context.conn.server.stopping)
        if self.dp.tracer.on:  # the call's trace context, for each of its requests
            stream.traceparent = _traceparent(context)
        reader = asyncio.ensure_future(stream.read(request_iterator))
        try:
            while True:
                item = await stream.next()
                if item is None:
                    break
                out, written = item
                if isinstance(out, _Failure):
                    if grpc_error:
                        raise _rpc_error(out.error)
                    out = out.in_band()
                yield out
                if written is not None:
                    written.set_result(None)
        finally:
            reader.cancel()
            await stream.close()
            await asyncio.gather(reader, return_exceptions=True)
            self.dp.stream_closed()


# Responses of a stream queued for writing past which a decoupled request's task waits until
# its own is written: the memory a client that reads slowly can hold up, beyond the model's
# response window and the transport's buffers.
QUEUED_BEFORE_WAITING = 8


class _Stream:
    """The requests of one ModelStreamInfer call, and their responses in the order they may
    leave. Each request is served by a task; a decoupled request's task hands over each
    response as it comes, so that responses leave in the order the models sent them, and
    waits for its response to be written once more than QUEUED_BEFORE_WAITING are queued (so
    a slow client slows the model, see dataplane.stream), while other requests' single
    responses line up in request order. A decoupled response with nothing ahead of it is
    written at once instead (`_leaves_now`).

    At most `max_inflight` requests are served at once; one more is answered UNAVAILABLE at
    once. Requests whose answers are not yet written (rejections included) are bounded too,
    at twice that: a client that sends faster than it reads stops being read from."""

    def __init__(self, dp: DataPlane, max_inflight: int = MAX_INFLIGHT_PER_CONNECTION,
                 metadata=None, header_pattern=None, call=None, stopping=None):
        self.dp = dp
        self._call = call  # the transport's, for send_now (None: every response is yielded)
        self._stopping = stopping  # () -> whether the server takes no new requests
        self._consumer_waiting = False  # next() waits, and all it returned was written
        self._metadata = metadata  # the stream's, for header forwarding (or None)
        self._header_pattern = header_pattern
        self._ready: asyncio.Queue = asyncio.Queue()  # (message, written future or None)
        self._in_order: collections.deque = collections.deque()  # futures, request order
        self._tasks: set = set()
        self._max_inflight = max_inflight
        self._room = asyncio.Semaphore(2 * max_inflight)
        self._reading = True
        self.traceparent = ""  # the call's W3C trace context, when some settings trace

    async def read(self, request_iterator) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for wire in request_iterator:
                named, request, error = self._read_request(wire)
                if error is None and self._stopping is not None and self._stopping():
                    error = ServerError(Code.UNAVAILABLE, transport.SHUTTING_DOWN)
                await self._room.acquire()
                if len(self._tasks) >= self._max_inflight:
                    self._in_order.append(_rejected(named, self._max_inflight))
                    self._ready.put_nowait(None)  # wakes next()
                    continue
                try:
                    decoupled = self.dp.is_decoupled(named.model_name, named.model_version)
                except ServerError:
                    decoupled = False  # the error is answered in order
                # Started now: the request reaches its scheduler in this turn of the loop.
                if decoupled:
                    task = eager.start(self._serve_decoupled(named, request, error), loop)
                    task.add_done_callback(self._room_back)
                else:
                    # Its room comes back once its answer leaves (see next()).
                    task = eager.start(self._serve_one(named, request, error), loop)
                    self._in_order.append(task)
                self._tasks.add(task)
                task.add_done_callback(self._task_done)
        finally:
            self._reading = False
            self._ready.put_nowait(None)

    def _room_back(self, task) -> None:
        self._room.release()

    def _task_done(self, task) -> None:
        self._tasks.discard(task)
        self._ready.put_nowait(None)  # wakes next(): an in-order answer may be due

    async def next(self):
        """The next (message or _Failure, written future or None); None when all is done."""
        while True:
            if self._in_order and self._in_order[0].done():
                task = self._in_order.popleft()
                self._room.release()
                if not task.cancelled():
                    return task.result(), None
                continue
            # Checked before waiting too: the wake-up that said the last answer was due may
            # have been taken already, by the turn that returned that answer.
            if self._done():
                return None
            self._consumer_waiting = True
            try:
                item = await self._ready.get()
            finally:
                self._consumer_waiting = False
            if item is not None:
                return item

    def _done(self) -> bool:
        return (not self._reading and not self._tasks and not self._in_order
                and self._ready.empty())

    async def _serve_one(self, named, request, error):
        """The single response of a request to a model that is not decoupled (or its error).
        `named`, `request`, `error`: as _read_request gives them."""
        if error is not None:
            return _Failure(named, error, True)
        try:
            async with contextlib.aclosing(self.dp.stream(request)) as responses:
                async for item in responses:
                    return _stream_response(named, item)
        except ServerError as exc:
            return _Failure(named, exc, True)

    async def _serve_decoupled(self, named, request, error) -> None:
        if error is not None:
            self._ready.put_nowait((_Failure(named, error, True), None))
            return
        loop = asyncio.get_running_loop()
        # A bool, or the request was refused (codec._REQUEST_PARAMETER_KINDS).
        empty_final = request.parameters.get("triton_enable_empty_final_response", False)
        try:
            async with contextlib.aclosing(self.dp.stream(request)) as responses:
                async for item in responses:
                    if item.response is None and item.error is None and not empty_final:
                        continue
                    out = _stream_response(named, item)
                    if self._leaves_now(out):
                        continue
                    written = loop.create_future()
                    self._ready.put_nowait((out, written))
                    # Back to the model at once while the client keeps up: responses then
                    # leave in the order they came, across requests too. Past the bound, a
                    # client that reads slowly slows the model.
                    if self._ready.qsize() > QUEUED_BEFORE_WAITING:
                        await written
        except ServerError as exc:
            self._ready.put_nowait((_Failure(named, exc, True), None))

    def _leaves_now(self, out) -> bool:
        """Writes `out` at once when nothing is ahead of it: nothing queued, and next() is
        back waiting (so all it returned was written). It saves the turn of the loop that
        waking next() takes, on every response of a stream (time to first response at c1:
        2-12 % less in alternating runs)."""
        return (self._consumer_waiting and self._ready.empty() and self._call is not None
                and not isinstance(out, _Failure) and self._call.send_now(out))

    def _read_request(self, wire) -> tuple:
        """(what names the request in its answers, the InferRequest, None) for a message
        that holds a valid request; (the parsed message, None, the ServerError) for one
        that does not. Read as ModelInfer reads its message, so a repeated request is decoded
        once (codec.read_model_infer_request)."""
        try:
            request = codec.read_model_infer_request(wire)
        except ServerError as exc:
            try:
                return proto.ModelInferRequest.FromString(wire), None, exc
            except DecodeError as parse_error:
                raise RpcError(transport.INTERNAL,
                               f"cannot parse the request message: {parse_error}") from None
        if self._metadata:
            header_forwarding.forward(request, self._metadata, self._header_pattern)
        request.traceparent = self.traceparent
        return request, request, None

    async def close(self) -> None:
        """The call ended: whatever is still running for it is cancelled."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _traceparent(context) -> str:
    return next((v for k, v in context.invocation_metadata() if k == "traceparent"), "")


def _rejected(named, max_inflight: int) -> asyncio.Future:
    """The answer, already there, to a request over the stream's in-flight cap."""
    answer = asyncio.get_running_loop().create_future()
    answer.set_result(_Failure(named, ServerError(
        Code.UNAVAILABLE, f"the stream has {max_inflight} requests in flight, the most it "
                          f"allows (--max-inflight-per-connection): retry later"), True))
    return answer


def _stream_response(named, item: StreamedResponse):
    """The serialized message for one response of the request `named` names (its id, model
    name and version); a _Failure for an error."""
    if item.error is not None:
        return _Failure(named, item.error, item.final)
    if item.response is not None:
        try:
            return codec.serialize_stream_infer_response(item.response, item.final)
        finally:
            item.response.done()
    out = proto.ModelStreamInferResponse()
    response = out.infer_response
    response.id = named.id
    response.model_name = named.model_name
    response.model_version = named.model_version
    response.parameters["triton_final_response"].bool_param = item.final
    return out.SerializeToString()


class _Failure:
    """An error for request `named`: in-band by default, the end of the call with
    `triton_grpc_error`."""

    __slots__ = ("named", "error", "final")

    def __init__(self, named, error: ServerError, final: bool):
        self.named = named
        self.error = error
        self.final = final

    def in_band(self):
        out = proto.ModelStreamInferResponse(error_message=self.error.message)
        response = out.infer_response
        response.id = self.named.id
        if isinstance(self.error, ModelError):
            # An answer, named as responses are. A request refused before a model ran it gets
            # its id alone, as in Triton.
            response.model_name = self.named.model_name
            response.model_version = self.named.model_version
            response.parameters["triton_final_response"].bool_param = self.final
        return out.SerializeToString()


def _region_statuses(response, statuses: list):
    for status in statuses:
        entry = response.regions[status["name"]]
        for key, value in status.items():
            setattr(entry, key, value)
    return response


class HealthServicer:
    def __init__(self, dataplane: DataPlane):
        self.dp = dataplane

    async def Check(self, request):
        return proto.HealthCheckResponse(status=SERVING if self.dp.server_live() else 2)


def _serialized(response: bytes) -> bytes:
    """The responses of ModelInfer and ModelStreamInfer, which the servicer serialized."""
    return response


def _methods(service_name: str, servicer, restrictions: dict) -> dict:
    table = {}
    for name, req_cls, resp_cls, client_stream, server_stream in proto.methods(service_name):
        fn = getattr(servicer, name, None)
        if fn is None:
            continue  # the transport answers UNIMPLEMENTED for methods without a handler
        if client_stream != server_stream:
            raise ValueError(f"{service_name}/{name}: one-sided streaming is not served")
        category = _CATEGORIES.get(name, "shared-memory" if "SharedMemory" in name else None)
        restriction = restrictions.get(category)
        if client_stream:
            handler = fn if restriction is None else _streaming(fn, restriction)
        else:
            handler = _unary(fn, with_context=name == "ModelInfer", restriction=restriction)
        # ModelInfer and ModelStreamInfer read their requests themselves
        # (codec.read_model_infer_request).
        infer = name in ("ModelInfer", "ModelStreamInfer")
        table[f"/{service_name}/{name}"] = Method(
            handler=handler,
            deserialize=None if infer else req_cls.FromString,
            serialize=_serialized if infer else resp_cls.SerializeToString,
            streaming=client_stream,
            check_partial=codec.check_partial_request if infer else None)
    return table


# The default `limits` (frozen, so one instance serves every call).
_DEFAULT_LIMITS = transport.ConnectionLimits()


def build_server(dataplane: DataPlane, max_message_size: int = MAX_MESSAGE_SIZE,
                 max_inflight_per_stream: int = MAX_INFLIGHT_PER_CONNECTION,
                 header_pattern=None, restrictions: dict | None = None,
                 keepalive: tuple = (transport.KEEPALIVE_TIME_S, transport.KEEPALIVE_TIMEOUT_S,
                                     False),
                 connection_age: tuple = (0.0, 0.0),
                 response_compression: str = "none",
                 prepare_answers: bool = True,
                 limits: transport.ConnectionLimits = _DEFAULT_LIMITS
                 ) -> GrpcServer:
    """A message above `max_message_size` either way fails its RPC with RESOURCE_EXHAUSTED,
    as gRPC's own limit does. `restrictions`: --grpc-restricted-protocol's
    (restricted_api.parse_restrictions); `keepalive`: (time s, timeout s, without calls);
    `connection_age`: (max age s, grace s), 0 for no limit; `response_compression`:
    --grpc-infer-response-compression-level; `prepare_answers`: --worker-answers; `limits`:
    what one client may hold (transport.ConnectionLimits)."""
    restrictions = restrictions or {}
    return GrpcServer({
        **_methods(proto.SERVICE_NAME, InferenceServicer(
            dataplane, max_inflight_per_stream, header_pattern, prepare_answers), restrictions),
        **_methods(proto.HEALTH_SERVICE_NAME, HealthServicer(dataplane), restrictions),
    }, max_message_size, keepalive_time=keepalive[0], keepalive_timeout=keepalive[1],
        keepalive_without_calls=keepalive[2], max_connection_age=connection_age[0],
        max_connection_age_grace=connection_age[1], response_compression=response_compression,
        limits=limits)
