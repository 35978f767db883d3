"""HTTP/REST endpoints of the KServe v2 protocol, with Triton's extensions and statuses.

Transport only: routes decode, call the dataplane, and encode; no scheduling or validation.
"""

import asyncio
import logging

import orjson
from aiohttp import web

from shmserve.dataplane import DataPlane
from shmserve.errors import Code, ServerError
from shmserve.http import codec, compression
from shmserve.stats import stats_json

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

HEADER_LENGTH = "Inference-Header-Content-Length"


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=codec.encode_error(message),
                        content_type="application/json")


def _json(obj) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def _version(request: web.Request) -> str:
    return request.match_info.get("version", "")


@web.middleware
async def _errors(request, handler):
    try:
        return await handler(request)
    except ServerError as exc:
        return _error(STATUS.get(exc.code, 400), exc.message)
    except web.HTTPNotFound:
        return _error(404, "Not Found")
    except web.HTTPMethodNotAllowed:
        return _error(405, "Method Not Allowed")
    except web.HTTPRequestEntityTooLarge as exc:
        return _error(400, f"request body exceeds the maximum input size: {exc.text}")


# Bodies above this are (de)compressed in a thread so the event loop keeps serving.
_OFF_LOOP_BYTES = 256 * 1024


async def _off_loop(fn, body, *args):
    if len(body) < _OFF_LOOP_BYTES:
        return fn(body, *args)
    return await asyncio.to_thread(fn, body, *args)


class HttpRoutes:
    def __init__(self, dataplane: DataPlane, max_input_size: int):
        self.dp = dataplane
        self.max_input_size = max_input_size

    async def live(self, request):
        return web.Response(status=200 if self.dp.server_live() else 400)

    async def ready(self, request):
        return web.Response(status=200 if self.dp.server_ready() else 400)

    async def server_metadata(self, request):
        return _json(self.dp.server_metadata())

    async def model_metadata(self, request):
        return _json(self.dp.model_metadata(request.match_info["model"], _version(request)))

    async def model_ready(self, request):
        if self.dp.model_ready(request.match_info["model"], _version(request)):
            return web.Response(status=200)
        return _error(400, "Model version not ready")

    async def model_config(self, request):
        _, config_json = self.dp.model_config(request.match_info["model"], _version(request))
        return _json(config_json)

    async def model_stats(self, request):
        name = request.match_info.get("model", "")
        stats = self.dp.model_statistics(name, _version(request))
        return _json({"model_stats": [stats_json(mv, s) for mv, s in stats]})

    async def repository_index(self, request):
        body = await request.read()
        ready = False
        if body:
            try:
                ready = bool(orjson.loads(body).get("ready", False))
            except (orjson.JSONDecodeError, AttributeError):
                raise ServerError(Code.INVALID_ARG, "failed to parse the request JSON buffer") from None
        return _json(self.dp.repository_index(ready))

    async def infer(self, request: web.Request):
        header = request.headers.get(HEADER_LENGTH)
        header_length = None
        if header is not None:
            try:
                header_length = int(header)
            except ValueError:
                raise ServerError(Code.INVALID_ARG,
                                  f"Unable to parse {HEADER_LENGTH}, got: {header}") from None
        body = await request.read()
        encoding = request.headers.get("Content-Encoding")
        if encoding and encoding.lower() != "identity":
            body = await _off_loop(compression.decompress, body, encoding, self.max_input_size)
        if header_length == 0:  # the body is the bytes of the model's only input
            infer_request = self.dp.raw_request(request.match_info["model"], _version(request),
                                                body)
            fmt = codec.OutputFormat(binary_default=True)
        else:
            infer_request, fmt = codec.decode_infer_request(
                body, header_length, request.match_info["model"], _version(request))
        response = await self.dp.infer(infer_request)
        try:
            chunks, out_header, content_type = codec.encode_infer_response(response, fmt)
            payload = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            response.done()
        resp = web.Response(content_type=content_type)
        accept = request.headers.get("Accept-Encoding")
        chosen = compression.choose(accept) if accept else None
        if chosen:
            payload = await _off_loop(compression.compress, payload, chosen)
            resp.headers["Content-Encoding"] = chosen
        resp.body = payload
        if out_header is not None:
            resp.headers[HEADER_LENGTH] = str(out_header)
        return resp


# aiohttp would inflate compressed bodies itself, without our bound on the inflated size.
RUNNER_OPTIONS = {"auto_decompress": False}


def build_app(dataplane: DataPlane, max_input_size: int) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=max_input_size)
    r = HttpRoutes(dataplane, max_input_size)
    m = "/v2/models/{model}"
    mv = "/v2/models/{model}/versions/{version:[0-9]+}"
    app.router.add_get("/v2", r.server_metadata)
    app.router.add_get("/v2/health/live", r.live)
    app.router.add_get("/v2/health/ready", r.ready)
    app.router.add_get("/v2/models/stats", r.model_stats)
    app.router.add_post("/v2/repository/index", r.repository_index)
    for prefix in (m, mv):
        app.router.add_get(prefix, r.model_metadata)
        app.router.add_get(prefix + "/ready", r.model_ready)
        app.router.add_get(prefix + "/config", r.model_config)
        app.router.add_get(prefix + "/stats", r.model_stats)
        app.router.add_post(prefix + "/infer", r.infer)
    return app
