"""The metrics endpoint (--metrics-port): GET /metrics answers the Prometheus text of the
collectors in observability/metrics.py, read at each scrape. The only part of the metrics that
speaks HTTP, so that observability/ never imports a transport."""

from shmserve.http.http1 import HttpServer
from shmserve.http.http1_messages import Request, Response, error_response
from shmserve.observability.metrics import (CUSTOM_METRICS_WAIT_S, build_collectors, exposition,
                                            refresh_custom_metrics)
from shmserve.registry import Registry


class MetricsText:
    """The Prometheus text of the server's collectors, as each scrape reads it: for the
    metrics port and for the /metrics the OpenAI routes serve beside them."""

    def __init__(self, registry: Registry, **settings):
        """`settings`: the --metrics-* flags, as build_collectors takes them."""
        self.registry = registry
        self.prom, self.gpu = build_collectors(registry, **settings)

    async def scrape(self) -> bytes:
        await refresh_custom_metrics(self.registry, CUSTOM_METRICS_WAIT_S)
        return exposition(self.prom)

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()


def build_metrics_server(metrics: MetricsText) -> HttpServer:
    async def handle(request: Request) -> Response:
        if request.path not in ("/metrics", "/metrics/"):
            return error_response(404, "Not Found")
        if request.method not in ("GET", "HEAD"):
            return error_response(405, "Method Not Allowed")
        return Response(200, await metrics.scrape(), "text/plain; charset=utf-8")

    return HttpServer(handle, max_input_size=64 * 1024, on_stop=metrics.close)
