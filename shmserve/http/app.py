"""HTTP/REST endpoints of the KServe v2 protocol, with Triton's extensions and statuses.

Transport only: routes decode, call the dataplane, and encode; no scheduling or validation.
"""

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import time
from types import SimpleNamespace

import orjson

from shmserve.dataplane import MAX_INFLIGHT_PER_CONNECTION, DataPlane, DecoupledModel
from shmserve.errors import Code, ModelError, ServerError
from shmserve.extensions import header_forwarding, restricted_api
from shmserve.http import codec, compression, generate, raw_request, region_routes
from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.http.http1 import HttpServer
from shmserve.http.http1_messages import Request, Response, error_response
from shmserve.http.http1_reader import triton_too_large
from shmserve.http.routing import MethodNotAllowed, NotFound, Router
from shmserve.observability.stats import stats_json
from shmserve.observability.tracing import SETTING_NAMES

log = logging.getLogger("shmserve.http")

STATUS = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.INVALID_ARG: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
    Code.UNKNOWN: 400,
}

HEADER_LENGTH = "inference-header-content-length"


def _json(obj) -> Response:
    return Response(200, orjson.dumps(obj), "application/json")


def _version(request: Request) -> str:
    return request.match_info.get("version", "")


# Bodies above this are (de)compressed in a thread so the event loop keeps serving.
_OFF_LOOP_BYTES = 256 * 1024


async def _off_loop(fn, body, *args):
    if len(body) < _OFF_LOOP_BYTES:
        return fn(body, *args)
    return await asyncio.to_thread(fn, body, *args)


_NOT_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream "
                     "for model that generates various number of responses")


class HttpRoutes:
    def __init__(self, dataplane: DataPlane, max_input_size: int, header_pattern=None,
                 prepare_answers: bool = True):
        """`header_pattern`: headers whose names it matches become request parameters
        (--http-header-forward-pattern; extensions/header_forwarding.py), or None.
        `prepare_answers`: models' workers may write infer answers (--worker-answers;
        fastpath/prepared_answers.py)."""
        self.dp = dataplane
        self.max_input_size = max_input_size
        self.header_pattern = header_pattern
        self.prepare_answers = prepare_answers

    async def live(self, request):
        return Response(200 if self.dp.server_live() else 400)

    async def ready(self, request):
        return Response(200 if self.dp.server_ready() else 400)

    async def server_metadata(self, request):
        return _json(self.dp.server_metadata())

    async def model_metadata(self, request):
        return _json(self.dp.model_metadata(request.match_info["model"], _version(request)))

    async def model_ready(self, request):
        if await self.dp.model_ready(request.match_info["model"], _version(request)):
            return Response(200)
        return error_response(400, "Model version not ready")

    async def model_config(self, request):
        _, config_json = self.dp.model_config(request.match_info["model"], _version(request))
        return _json(config_json)

    async def model_stats(self, request):
        name = request.match_info.get("model", "")
        stats = self.dp.model_statistics(name, _version(request))
        return _json({"model_stats": [stats_json(mv, s) for mv, s in stats]})

    async def log_settings(self, request):
        """GET: the log settings; POST: change the ones the body names, then the same."""
        if request.method == "POST":
            changes = _json_body(request)
            # Triton skips a setting whose value is null.
            return _json(self.dp.update_log_settings(
                {k: v for k, v in changes.items() if v is not None}))
        return _json(self.dp.log_settings())

    async def trace_settings(self, request):
        """GET: the trace settings (a model's, on its path); POST: change the ones the body
        names, then the same."""
        model = request.match_info.get("model", "")
        if request.method == "POST":
            return _json(self.dp.update_trace_settings(model,
                                                       _trace_changes(_json_body(request))))
        return _json(self.dp.trace_settings(model))

    async def repository_index(self, request):
        ready = _json_body(request).get("ready", False)
        if type(ready) is not bool:
            raise ServerError(Code.INVALID_ARG, "Unable to parse 'ready': expected true or false")
        return _json(self.dp.repository_index(ready, request.match_info.get("repository", "")))

    async def repository_load(self, request):
        """`config`: a ModelConfig JSON string; `file:<version>/<name>`: base64 file content."""
        params = _json_body(request).get("parameters") or {}
        config = params.get("config")
        files = {}
        for key, value in params.items():
            if key.startswith("file:"):
                try:
                    files[key] = base64.b64decode(value, validate=True)
                except (binascii.Error, TypeError, ValueError):
                    raise ServerError(Code.INVALID_ARG,
                                      f"unable to decode base64 content of '{key}'") from None
        await self.dp.load_model(request.match_info["model"], config, files,
                                 request.match_info.get("repository", ""))
        return Response(200)

    async def repository_unload(self, request):
        params = _json_body(request).get("parameters") or {}
        unload_dependents = params.get("unload_dependents", False)
        if not isinstance(unload_dependents, bool):
            raise ServerError(Code.INVALID_ARG, "Unable to parse 'unload_dependents': "
                                                "expected a boolean")
        await self.dp.unload_model(request.match_info["model"], unload_dependents,
                                   request.match_info.get("repository", ""))
        return Response(200)

    async def infer(self, request: Request):
        header = request.headers.get(HEADER_LENGTH)
        header_length = None
        if header is not None:
            # ASCII digits only: int() would also take "1_000", signs and other scripts' digits.
            if not (header.isascii() and header.isdigit()):
                raise ServerError(Code.INVALID_ARG,
                                  f"Unable to parse {HEADER_LENGTH}, got: {header}")
            header_length = int(header)
        body = request.body
        encoding = request.headers.get("content-encoding")
        if encoding and encoding.lower() != "identity":
            body = await _off_loop(compression.decompress, body, encoding, self.max_input_size)
        if header_length == 0:  # the body is the bytes of the model's only input
            name, version = request.match_info["model"], _version(request)
            infer_request = raw_request.decode_raw_request(
                name, version, self.dp.signature(name, version), body,
                self.dp.max_tensor_byte_size)
            fmt = codec.OutputFormat(binary_default=True)
        else:
            infer_request, fmt = codec.decode_infer_request(
                body, header_length, request.match_info["model"], _version(request))
        if self.header_pattern is not None:
            header_forwarding.forward(infer_request, request.headers.items(),
                                      self.header_pattern)
        self._note_for_tracing(request, infer_request)
        accept = request.headers.get("accept-encoding")
        chosen = compression.choose(accept) if accept else None
        # The fast path: its template decides the answer up to the outputs' bytes, which the
        # model's worker may then write (fastpath/prepared_answers.py).
        loans = None
        if self.prepare_answers and infer_request.template is not None and not encoding \
                and not chosen:
            loans = request.connection.loans
            infer_request.prepared_answer = loans.prepared(infer_request.template, None)
        try:
            response = await self.dp.infer(infer_request)
        except DecoupledModel:
            raise ServerError(Code.UNSUPPORTED, "HTTP end point doesn't support models with "
                                                "decoupled transaction policy") from None
        if response.written_by_worker:  # the fast path: the model's worker wrote it
            return WRITTEN_BY_WORKER
        try:
            chunks, out_header, content_type = codec.encode_infer_response(response, fmt)
            payload = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            response.done()
        headers = {"Content-Type": content_type}
        if chosen:
            payload = await _off_loop(compression.compress, payload, chosen)
            headers["Content-Encoding"] = chosen
        if out_header is not None:
            headers["Inference-Header-Content-Length"] = str(out_header)
        reply = Response(200, payload, headers=headers)
        # The fast path: this answer's layout, for the connection's next request.
        if loans is not None and out_header is not None and request.connection.lendable():
            head = request.connection.head(200, headers, len(payload))
            loans.learn(infer_request.template, response.model_version,
                        codec.prepared_answer(head, chunks, response))
        if response.trace is not None:
            response.trace.stamp("HTTP_SEND_START", time.perf_counter_ns())
            reply.on_sent = functools.partial(_sent, response.trace)
        return reply


    async def generate(self, request: Request):
        """Exactly one response, as one JSON object. A model that sends more, or none, gets
        Triton 2.51's answer: status 200 (Triton has sent it by the time it counts them) and
        an error as the body."""
        infer_request = await self._generate_request(request)
        payload = None
        count = 0
        async with contextlib.aclosing(self.dp.stream(infer_request)) as responses:
            try:
                async for item in responses:
                    if item.error is not None:
                        raise item.error
                    if item.response is None:
                        continue
                    count += 1
                    try:
                        # The rest of a stream that is one too many still runs to its end,
                        # as in Triton, which counts the request a success.
                        if count == 1:
                            payload = generate.encode_generate_response(item.response)
                    finally:
                        item.response.done()
            except ModelError as exc:  # Triton's generate: 400, whatever the model said
                return error_response(400, exc.message)
        if count != 1:
            return error_response(200, _NOT_ONE_RESPONSE)
        return Response(200, payload, "application/json")

    async def generate_stream(self, request: Request):
        """Server-sent events, one per response. The first response fixes the HTTP status;
        an error after it arrives as an `error` event."""
        self.dp.stream_opened()
        try:
            return await self._event_stream(request)
        finally:
            self.dp.stream_closed()

    async def _event_stream(self, request: Request):
        infer_request = await self._generate_request(request)
        stream = None
        async with contextlib.aclosing(self.dp.stream(infer_request)) as responses:
            try:
                async for item in responses:
                    if stream is None:
                        if item.error is not None:
                            raise item.error
                        stream = request.stream(SSE_HEADERS)
                    if item.error is not None:
                        await stream.write(generate.sse_error(item.error.message))
                    elif item.response is not None:
                        try:
                            event = generate.sse_data(
                                generate.encode_generate_response(item.response))
                        finally:
                            item.response.done()
                        await stream.write(event)
            except ServerError as exc:
                if stream is None:
                    if isinstance(exc, ModelError):  # as Triton: 400, the error as an event
                        return Response(400, generate.sse_error(exc.message),
                                        headers=dict(SSE_HEADERS))
                    raise
                await stream.write(generate.sse_error(exc.message))
        await stream.end()
        return None

    async def _generate_request(self, request: Request):
        name = request.match_info["model"]
        version = _version(request)
        signature = self.dp.signature(name, version)  # an unknown model first, as in Triton
        encoding = request.headers.get("content-encoding")
        if encoding and encoding != "identity":  # Triton's words; it compares case and all
            raise ServerError(Code.INVALID_ARG,
                              "Unsupported content-encoding, only 'identity' is supported.")
        infer_request = generate.decode_generate_request(request.body, name, version, signature)
        if self.header_pattern is not None:
            header_forwarding.forward(infer_request, request.headers.items(),
                                      self.header_pattern)
        self._note_for_tracing(request, infer_request)
        return infer_request

    def _note_for_tracing(self, request: Request, infer_request) -> None:
        """When the request was read, and the client's trace context: what a trace of it
        starts from, if some settings trace."""
        if self.dp.tracer.on:
            infer_request.received = (("HTTP_RECV_START", request.begun_ns),
                                      ("HTTP_RECV_END", time.perf_counter_ns()))
            infer_request.traceparent = request.headers.get("traceparent", "")


def _json_body(request: Request) -> dict:
    """The request's JSON object; {} for an empty body."""
    body = request.body
    if not body:
        return {}
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise ServerError(Code.INVALID_ARG, "failed to parse the request JSON buffer")
    return obj


def _trace_changes(body: dict) -> dict:
    """The trace settings a POST names: {name: list of strings, or None to clear}."""
    changes = {}
    for name, value in body.items():
        if name not in SETTING_NAMES:
            continue  # ignored, as in Triton
        if value is None:
            changes[name] = None
        elif name == "trace_level" and isinstance(value, list) \
                and all(isinstance(v, str) for v in value):
            changes[name] = value
        elif name != "trace_level" and isinstance(value, str):
            changes[name] = [value]
        else:
            expected = "an array of strings" if name == "trace_level" else "a string"
            raise ServerError(Code.INVALID_ARG, f"Unable to parse '{name}': expected "
                                                f"{expected}, got {orjson.dumps(value).decode()}")
    return changes


def _sent(trace) -> None:
    trace.stamp("HTTP_SEND_END", time.perf_counter_ns())


SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}

class _Routes:
    """The router, each route with its API category (extensions/restricted_api.py): a category that
    --http-restricted-api restricts answers 403 to requests without its header."""

    def __init__(self, router: Router, restrictions: dict):
        self.router = router
        self.restrictions = restrictions

    def add(self, method: str, pattern: str, handler, category: str) -> None:
        restriction = self.restrictions.get(category)
        if restriction is not None:
            handler = _guarded(handler, restriction)
        self.router.add(method, pattern, handler)

    def of(self, category: str):
        """An object whose `add(method, pattern, handler)` puts routes in `category`."""
        return SimpleNamespace(add=lambda method, pattern, handler:
                               self.add(method, pattern, handler, category))


def _guarded(handler, restriction: tuple):
    async def guarded(request: Request):
        if not restricted_api.allowed(restriction, request.headers.items()):
            return error_response(403, restricted_api.refusal(restriction[0]))
        return await handler(request)
    return guarded


def build_server(dataplane: DataPlane, max_input_size: int,
                 max_inflight_per_connection: int = MAX_INFLIGHT_PER_CONNECTION,
                 header_pattern=None, restrictions: dict | None = None,
                 prepare_answers: bool = True, more_routes=None,
                 too_large=triton_too_large) -> HttpServer:
    """`more_routes(router)` adds routes of another API (the OpenAI routes); `too_large` is
    the answer to a body over `max_input_size` (HttpServer's)."""
    router = Router()
    routes = _Routes(router, restrictions or {})
    r = HttpRoutes(dataplane, max_input_size, header_pattern, prepare_answers)
    m = "/v2/models/{model}"
    mv = "/v2/models/{model}/versions/{version:[0-9]+}"
    # The router tries a path's routes in the order they were added: inference first.
    for prefix in (m, mv):
        routes.add("POST", prefix + "/infer", r.infer, "inference")
    routes.add("GET", "/v2", r.server_metadata, "metadata")
    routes.add("GET", "/v2/health/live", r.live, "health")
    routes.add("GET", "/v2/health/ready", r.ready, "health")
    routes.add("GET", "/v2/models/stats", r.model_stats, "statistics")
    routes.add("GET", "/v2/trace/setting", r.trace_settings, "trace")
    routes.add("POST", "/v2/trace/setting", r.trace_settings, "trace")
    # Not per version: Triton serves no /versions/{v}/trace/setting.
    routes.add("GET", m + "/trace/setting", r.trace_settings, "trace")
    routes.add("POST", m + "/trace/setting", r.trace_settings, "trace")
    routes.add("GET", "/v2/logging", r.log_settings, "logging")
    routes.add("POST", "/v2/logging", r.log_settings, "logging")
    for repository in ("/v2/repository", "/v2/repository/{repository}"):
        routes.add("POST", repository + "/index", r.repository_index, "model-repository")
        routes.add("POST", repository + "/models/{model}/load", r.repository_load,
                   "model-repository")
        routes.add("POST", repository + "/models/{model}/unload", r.repository_unload,
                   "model-repository")
    for prefix in (m, mv):
        routes.add("GET", prefix, r.model_metadata, "metadata")
        routes.add("GET", prefix + "/ready", r.model_ready, "health")
        routes.add("GET", prefix + "/config", r.model_config, "model-config")
        routes.add("GET", prefix + "/stats", r.model_stats, "statistics")
        routes.add("POST", prefix + "/generate", r.generate, "inference")
        routes.add("POST", prefix + "/generate_stream", r.generate_stream, "inference")
    region_routes.add_routes(routes.of("shared-memory"), dataplane.shared_memory)
    if more_routes is not None:
        more_routes(router)

    async def handle(request: Request) -> Response | None:
        try:
            handler, request.match_info = router.resolve(request.method, request.path)
            return await handler(request)
        except ServerError as exc:
            return error_response(STATUS.get(exc.code, 400), exc.message)
        except NotFound:
            return error_response(404, "Not Found")
        except MethodNotAllowed:
            return error_response(405, "Method Not Allowed")

    return HttpServer(handle, max_input_size, max_inflight_per_connection, too_large=too_large)
