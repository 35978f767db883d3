"""Where the OpenAI routes are served: beside the KServe routes on the HTTP port
(`add_to`), and alone on --openai-port (`build_openai_server`), as Triton's frontend serves
them (FastAPI's 404 and 405 bodies there). Either way --openai-restricted-api guards them, a
body over --http-max-input-size gets 413 in the OpenAI error form, and /health/ready and
/metrics are served beside them."""

import orjson

from shmserve.http.http1 import HttpServer
from shmserve.http.http1_messages import Request, Response
from shmserve.http.routing import MethodNotAllowed, NotFound, Router
from shmserve.openai import restrictions
from shmserve.openai.routes import OpenAIRoutes, detail_response

_OPENAI_PATHS = (b"/v1/", b"/health/ready", b"/metrics")


def add_to(router: Router, routes: OpenAIRoutes) -> None:
    for method, pattern, handler, group in routes.routes():
        router.add(method, pattern, _guarded(handler, routes.settings.restrictions.get(group)))


def too_large(url: bytes, size: int, limit: int) -> Response:
    """Triton's frontend's answer to a body over the limit."""
    message = (f"Request size of {size} bytes exceeds the maximum allowed input size of "
               f"{limit} bytes. Use --http-max-input-size to increase the limit.")
    return Response(413, orjson.dumps({"error": {"message": message,
                                                 "type": "invalid_request_error",
                                                 "code": "content_too_large"}}),
                    "application/json")


def too_large_on_http_port(fallback):
    """The HTTP port's answer to a body over the limit: the OpenAI form for OpenAI paths,
    `fallback`'s for the others."""
    def answer(url: bytes, size: int, limit: int) -> Response:
        if url.startswith(_OPENAI_PATHS):
            return too_large(url, size, limit)
        return fallback(url, size, limit)
    return answer


def build_openai_server(routes: OpenAIRoutes, max_input_size: int,
                        max_inflight: int) -> HttpServer:
    router = Router()
    add_to(router, routes)

    async def handle(request: Request) -> Response | None:
        try:
            handler, request.match_info = router.resolve(request.method, request.path)
        except NotFound:
            return detail_response(404, "Not Found")
        except MethodNotAllowed:
            return detail_response(405, "Method Not Allowed")
        return await handler(request)

    return HttpServer(handle, max_input_size, max_inflight, too_large=too_large)


def _guarded(handler, restriction):
    if restriction is None:
        return handler

    async def guarded(request: Request):
        refusal = restrictions.refusal(restriction, request.headers)
        if refusal is not None:
            return Response(401, refusal, "application/json")
        return await handler(request)
    return guarded
