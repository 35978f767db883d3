"""The server: repository, schedulers, workers and the three endpoints, in one object.

`Server` is also the in-process API (Triton's C API counterpart) for applications that embed
shmserve: `await server.start()`, `await server.infer(InferRequest(...))`, `await server.stop()`.
"""

import asyncio
import functools
import logging
import math
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from shmserve import dataplane as limits
from shmserve import warmup
from shmserve.config.backend import DEFAULT_BACKEND_DIRECTORY
from shmserve.dataplane import DataPlane
from shmserve.dispatch.front_spin import FrontSpin
from shmserve.dispatch.pool import DEFAULT_PIPELINE_BELOW_US
from shmserve.dispatch.rate_limiter import RateLimiter
from shmserve.dispatch.supervisor import Supervisor
from shmserve.dispatch.watchdog import SegmentWatchdog
from shmserve.extensions import header_forwarding
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.extensions.response_cache import ResponseCache
from shmserve.grpc import transport as grpc_transport
from shmserve.grpc.tls import TlsSettings, server_context
from shmserve.host import systemd
from shmserve.host.gc_tuning import GcTuner
from shmserve.inference import InferRequest, InferResponse
from shmserve.ipc import scratch, segments
from shmserve.ipc.idle_spin import DEFAULT_SPIN_US
from shmserve.model_calls import ServerCalls
from shmserve.observability.tracing import TraceSettings, Tracer
from shmserve.registry import Registry
from shmserve.repository.loader import Loader, gpu_count
from shmserve.repository.manager import ModelManager

if TYPE_CHECKING:
    from shmserve.http.http1 import HttpServer

log = logging.getLogger("shmserve")


class StartupError(RuntimeError):
    """The server cannot start as asked (a model failed to load, and --exit-on-error)."""


@dataclass
class Options:
    model_repository: list = field(default_factory=list)
    model_control_mode: str = "none"
    load_model: list = field(default_factory=list)
    repository_poll_secs: int = 15
    model_config_name: Optional[str] = None
    disable_auto_complete: bool = False
    # --backend-config: {backend, or "" for every backend: {setting: value}}
    backend_config: dict = field(default_factory=dict)
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY
    server_id: str = "shmserve"
    strict_readiness: bool = True
    exit_timeout_secs: int = 30
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    # --metrics-config: Triton's cumulative latency counters (on) and first-response
    # histogram (off).
    metrics_counter_latencies: bool = True
    metrics_histogram_latencies: bool = False
    # Quantiles (and errors) of the latency summaries; none: no summaries (Triton's default).
    metrics_summary_quantiles: tuple = ()
    allow_client_shm: bool = False  # as Triton since 2.68
    # The response cache's size in bytes (--cache-config local,size=N); 0: no cache.
    cache_size: int = 0
    trace: TraceSettings = field(default_factory=TraceSettings)  # --trace-config
    # Triton's: a model that fails to load at startup stops the server from starting.
    exit_on_error: bool = True
    model_load_retry_count: int = 0  # more tries for a version that failed to load
    # Regular expressions of request headers forwarded to models as parameters ("": none).
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # API category -> (header, value) that its requests must carry (extensions/restricted_api.py).
    http_restrictions: dict = field(default_factory=dict)
    grpc_restrictions: dict = field(default_factory=dict)
    # The OpenAI routes (shmserve/openai/): served on the HTTP port, and on openai_port too
    # when it is not 0; the tokenizer folder and chat template for chat; what
    # --openai-restricted-api restricts (openai/restrictions.py).
    openai_port: int = 0
    openai_tokenizer: str | None = None
    openai_chat_template: str | None = None
    openai_default_max_tokens: int = 16
    openai_restrictions: dict = field(default_factory=dict)
    # gRPC keepalive PINGs (Triton's defaults; ms, as its flags).
    grpc_keepalive_time_ms: int = 7_200_000
    grpc_keepalive_timeout_ms: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    # GOAWAY to connections older than this (ms; 0: no limit), closed after the grace.
    grpc_max_connection_age_ms: int = 0
    grpc_max_connection_age_grace_ms: int = 0
    # How much the messages the server sends are compressed: none, low, medium, high.
    grpc_infer_response_compression_level: str = "none"
    grpc_tls: Optional[TlsSettings] = None  # TLS for gRPC (--grpc-use-ssl[-mutual])
    # gRPC's ping policy (tritonserver's --grpc-http2-* flags and defaults).
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    # What one gRPC client may hold (grpc/transport.py ConnectionLimits); shmserve's own.
    grpc_max_connections: int = grpc_transport.MAX_CONNECTIONS  # 0: no limit
    grpc_max_connection_idle_ms: int = int(grpc_transport.MAX_CONNECTION_IDLE_S * 1000)
    grpc_max_decompressed_size: int = grpc_transport.MAX_DECOMPRESSED_SIZE
    max_open_streams_per_connection: int = grpc_transport.MAX_STREAMING_CALLS_PER_CONNECTION
    # --rate-limit=execution_count, and the --rate-limit-resource (name, count, device or None)
    rate_limit: bool = False
    rate_limit_resources: tuple = ()
    # shmserve's own: how long a worker polls for its next batch before it sleeps, while
    # the machine has a core to spare (0: never).
    worker_spin_us: int = DEFAULT_SPIN_US
    # shmserve's own: how long the front polls after it sent a batch and after one ended
    # before it sleeps, while the machine has a core to spare (0: never).
    front_spin_us: int = DEFAULT_SPIN_US
    # shmserve's own: an instance whose batches take less than this is sent its next batch
    # while it runs one (0: never, as Triton).
    pipeline_below_us: int = DEFAULT_PIPELINE_BELOW_US
    # Models' workers may write infer answers themselves (fastpath/prepared_answers.py).
    worker_answers: bool = True
    # shmserve's own: an instance that holds work and sends nothing for this long is killed
    # and restarted (0: never).
    model_instance_timeout_secs: float = 0.0
    # Limits (docs/limits.md); all but the gRPC message size are shmserve's own.
    grpc_max_message_size: int = limits.MAX_MESSAGE_SIZE
    max_tensor_byte_size: int = limits.MAX_TENSOR_BYTE_SIZE
    max_inflight_per_connection: int = limits.MAX_INFLIGHT_PER_CONNECTION
    max_open_streams: int = limits.MAX_OPEN_STREAMS
    max_queue_size_default: int = limits.MAX_QUEUE_SIZE_DEFAULT  # 0: unbounded


class Server:
    def __init__(self, options: Options):
        self.options = options
        self.registry = Registry()
        self.shared_memory = SharedMemoryManager(allowed=options.allow_client_shm,
                                                 gpu_count=gpu_count())
        self.supervisor = Supervisor(hang_timeout=options.model_instance_timeout_secs)
        self.loader = Loader(self.registry, options.model_repository,
                             config_name=options.model_config_name,
                             disable_auto_complete=options.disable_auto_complete,
                             backend_config=options.backend_config,
                             backend_directory=options.backend_directory,
                             load_retries=options.model_load_retry_count,
                             summary_quantiles=(options.metrics_summary_quantiles
                                                if options.allow_metrics else ()),
                             rate_limiter=(RateLimiter(options.rate_limit_resources)
                                           if options.rate_limit else None),
                             worker_spin_us=options.worker_spin_us,
                             front_spin=(FrontSpin(options.front_spin_us)
                                         if options.front_spin_us else None),
                             pipeline_below_us=options.pipeline_below_us,
                             gpu_metric_labels=(options.allow_metrics
                                                and options.allow_gpu_metrics),
                             on_instance_exit=self.supervisor.instance_exited,
                             on_pool_ready=self.supervisor.watch,
                             on_pool_stopped=self.supervisor.forget,
                             on_instance_added=self.supervisor.watch_instance,
                             on_instance_removed=self.supervisor.forget_instance)
        self.models = ModelManager(self.registry, self.loader,
                                   mode=options.model_control_mode,
                                   startup_models=options.load_model,
                                   poll_secs=options.repository_poll_secs,
                                   drain_timeout=options.exit_timeout_secs)
        self.dataplane = DataPlane(self.registry, self.shared_memory,
                                   server_id=options.server_id,
                                   strict_readiness=options.strict_readiness,
                                   models=self.models,
                                   max_tensor_byte_size=options.max_tensor_byte_size,
                                   max_queue_size_default=options.max_queue_size_default,
                                   max_open_streams=options.max_open_streams,
                                   response_cache=(ResponseCache(options.cache_size)
                                                   if options.cache_size else None),
                                   first_response_histogram=(
                                       options.allow_metrics
                                       and options.metrics_histogram_latencies),
                                   tracer=Tracer(options.trace))
        self.loader.step_runner = self.dataplane.run_step  # ensembles run their steps there
        self.loader.server_calls = ServerCalls(self.dataplane)  # BLS and model control
        self.loader.warm_up = functools.partial(warmup.warm_up,
                                                max_tensor_bytes=options.max_tensor_byte_size)
        self._http_servers: list = []  # inference HTTP and metrics
        self._http: HttpServer | None = None  # the inference HTTP server
        self._grpc: grpc_transport.GrpcServer | None = None
        # Set by a second SIGTERM/SIGINT: in-flight work fails instead of being waited for.
        self._hurry = asyncio.Event()
        self._gc_tuner = GcTuner()
        # Unlinks this process's shared memory if it is killed (see dispatch/watchdog.py).
        self._watchdog = SegmentWatchdog()

    async def start(self) -> None:
        removed = segments.sweep_dead_segments()
        if removed:
            log.info("removed %d shared-memory segment(s) of dead shmserve processes", len(removed))
        removed = scratch.sweep_dead_folders()
        if removed:
            log.info("removed %d scratch folder(s) of dead shmserve processes", len(removed))
        await self._watchdog.start()  # before any segment is made
        self.dataplane.live = True
        await self.models.start()
        failures = self.models.startup_failures()
        for failure in failures:
            log.error("%s", failure)
        if failures and self.options.exit_on_error:
            await self.stop()
            raise StartupError("failed to load all models (--exit-on-error=false serves the "
                               "others)")
        self.dataplane.accepting = True
        try:
            await self._start_endpoints()
        except BaseException:
            await self.stop()
            raise
        self._gc_tuner.start(asyncio.get_running_loop())
        log.info("shmserve ready: %s", ", ".join(self._endpoint_names()))

    async def _start_endpoints(self) -> None:
        # HTTP last: its /v2/health/live is what clients and probes wait on, so when it
        # answers, the gRPC and metrics ports are listening too.
        opts = self.options
        if opts.allow_grpc:
            from shmserve.grpc.servicer import build_server as build_grpc_server
            self._grpc = build_grpc_server(
                self.dataplane, opts.grpc_max_message_size, opts.max_inflight_per_connection,
                header_forwarding.compile_pattern(opts.grpc_header_forward_pattern),
                opts.grpc_restrictions,
                (opts.grpc_keepalive_time_ms / 1000, opts.grpc_keepalive_timeout_ms / 1000,
                 opts.grpc_keepalive_permit_without_calls),
                (opts.grpc_max_connection_age_ms / 1000,
                 opts.grpc_max_connection_age_grace_ms / 1000),
                opts.grpc_infer_response_compression_level, opts.worker_answers,
                grpc_transport.ConnectionLimits(
                    max_connections=opts.grpc_max_connections,
                    max_streaming_calls=opts.max_open_streams_per_connection,
                    max_connection_idle=opts.grpc_max_connection_idle_ms / 1000,
                    max_decompressed_size=opts.grpc_max_decompressed_size,
                    ping_interval=opts.grpc_http2_min_recv_ping_interval_without_data_ms / 1000,
                    max_ping_strikes=opts.grpc_http2_max_ping_strikes))
            await self._grpc.start(opts.grpc_address, opts.grpc_port,
                                   server_context(opts.grpc_tls) if opts.grpc_tls else None)
        scrape = None
        if opts.allow_metrics:
            from shmserve.http.metrics_endpoint import MetricsText, build_metrics_server
            metrics = MetricsText(self.registry,
                                  allow_cpu_metrics=opts.allow_cpu_metrics,
                                  allow_gpu_metrics=opts.allow_gpu_metrics,
                                  interval_ms=opts.metrics_interval_ms,
                                  counter_latencies=opts.metrics_counter_latencies,
                                  histogram_latencies=opts.metrics_histogram_latencies)
            scrape = metrics.scrape
            metrics_server = build_metrics_server(metrics)
            await metrics_server.start(opts.metrics_address, opts.metrics_port)
            self._http_servers.append(metrics_server)
        if opts.allow_http or opts.openai_port:
            from shmserve.openai import endpoints
            from shmserve.openai.routes import OpenAIRoutes, OpenAISettings
            openai_routes = OpenAIRoutes(self.dataplane, OpenAISettings(
                opts.openai_tokenizer, opts.openai_chat_template, opts.openai_default_max_tokens,
                opts.openai_restrictions), scrape)
        if opts.openai_port:
            openai_server = endpoints.build_openai_server(
                openai_routes, opts.http_max_input_size, opts.max_inflight_per_connection)
            await openai_server.start(opts.http_address, opts.openai_port)
            self._http_servers.append(openai_server)
        if opts.allow_http:
            from shmserve.http.app import build_server as build_http_server
            from shmserve.http.http1_reader import triton_too_large
            http = build_http_server(
                self.dataplane, opts.http_max_input_size, opts.max_inflight_per_connection,
                header_forwarding.compile_pattern(opts.http_header_forward_pattern),
                opts.http_restrictions, opts.worker_answers,
                more_routes=lambda router: endpoints.add_to(router, openai_routes),
                too_large=endpoints.too_large_on_http_port(triton_too_large))
            await http.start(opts.http_address, opts.http_port)
            self._http_servers.append(http)
            self._http = http

    def _endpoint_names(self) -> list:
        o = self.options
        out = []
        if o.allow_http:
            out.append(f"HTTP {o.http_address}:{o.http_port}")
        if o.openai_port:
            out.append(f"OpenAI {o.http_address}:{o.openai_port}")
        if o.allow_grpc:
            out.append(f"gRPC {o.grpc_address}:{o.grpc_port}")
        if o.allow_metrics:
            out.append(f"metrics {o.metrics_address}:{o.metrics_port}")
        return out

    async def infer(self, request: InferRequest) -> InferResponse:
        """In-process inference; call `response.done()` when finished with its outputs."""
        return await self.dataplane.infer(request)

    def stream(self, request: InferRequest):
        """In-process streaming: an async iterator of StreamedResponse (see DataPlane.stream);
        call `done()` on each response when finished with its outputs."""
        return self.dataplane.stream(request)

    async def stop(self) -> None:
        """Stop as Triton does, in one --exit-timeout-secs: the HTTP and gRPC ports close at
        once and gRPC takes no new calls, while open HTTP connections are still served until
        their clients close them and gRPC calls in flight finish. Then new work is refused
        and what is still in flight (in-process calls) is waited for with the time left;
        then the endpoints and the models stop (finalized; instances still busy are killed)
        and every shared-memory segment is unlinked. Readiness is false from the start,
        on the connections still open; `hurry()` ends the waits at once."""
        self.dataplane.stopping = True
        deadline = asyncio.get_running_loop().time() + self.options.exit_timeout_secs
        await self._close_connections(deadline)
        self.dataplane.accepting = False
        left = await self._drain(deadline)
        await self.supervisor.stop()  # what dies from now on stays dead
        if left:
            cause = ("a second SIGTERM/SIGINT" if self._hurry.is_set() else
                     f"--exit-timeout-secs={self.options.exit_timeout_secs} expired")
            log.warning("stopping with %d request(s) still in flight (%s): they fail", left, cause)
            self._kill_busy_instances(f"was killed: the server shut down before it finished "
                                      f"({cause})")
        if self._grpc is not None:
            await self._grpc.stop(grace=ENDPOINT_GRACE_S)
            self._grpc = None
        # The waits are over: handlers still running when an endpoint stops are cancelled
        # after this grace.
        for server in self._http_servers:
            await server.stop(grace=ENDPOINT_GRACE_S)
        self._http_servers.clear()
        self._http = None
        self.shared_memory.unregister_all()
        await self.models.stop()
        await self._watchdog.stop()  # every segment is unlinked by now
        await asyncio.get_running_loop().run_in_executor(None, self.dataplane.tracer.close)
        self.dataplane.live = False
        self._gc_tuner.stop()
        log.info("shmserve stopped")

    async def _start_unless(self, stop: asyncio.Event) -> None:
        """Start, unless a stop signal comes first: a model that is still loading then (an
        initialize() or a warmup that takes long, or hangs) is abandoned, and its worker ends
        with the front (workers/front_watch.py)."""
        starting = asyncio.ensure_future(self.start())
        signalled = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            signalled.cancel()
        if starting.done():
            starting.result()  # a start that failed says why
            return
        log.warning("stopping before every model loaded: the loads still running are abandoned")
        starting.cancel()
        try:
            await starting
        except asyncio.CancelledError:
            pass

    def hurry(self) -> None:
        """End a drain now: what is still in flight fails rather than being waited for."""
        self._hurry.set()

    async def _close_connections(self, deadline: float) -> None:
        """Closes the HTTP and gRPC ports and waits, until `deadline` (loop time), for the
        connections still open to close, saying each second what is left as Triton does."""
        http, grpc = self._http, self._grpc
        if http is not None:
            http.stop_accepting()
        if grpc is not None:
            grpc.stop_accepting()
        said = None
        while not self._hurry.is_set():
            http_left = len(http.connections) if http is not None else 0
            grpc_left = len(grpc.connections) if grpc is not None else 0
            seconds = math.ceil(deadline - asyncio.get_running_loop().time())
            if not (http_left or grpc_left) or seconds <= 0:
                return
            if seconds != said:
                said = seconds
                if http_left:
                    log.info("Timeout %d: Found %d HTTP service connections", seconds, http_left)
                if grpc_left:
                    log.info("Timeout %d: Found %d GRPC service connections and inference "
                             "handlers", seconds, grpc_left)
            await self._pause()

    async def _drain(self, deadline: float) -> int:
        """Wait until nothing is in flight, until `deadline` (loop time) or `hurry()`;
        returns how many requests are still in flight."""
        loop = asyncio.get_running_loop()
        log.info("Waiting for in-flight requests to complete.")
        said = None
        while (left := self.dataplane.in_flight) and not self._hurry.is_set():
            seconds = math.ceil(deadline - loop.time())
            if seconds <= 0:
                break
            if seconds != said:
                said = seconds
                log.info("Timeout %d: Found %d in-flight requests", seconds, left)
            await self._pause()
        return self.dataplane.in_flight

    async def _pause(self) -> None:
        # Polled: only a stopping server pays for it, not every request's end.
        try:
            await asyncio.wait_for(self._hurry.wait(), DRAIN_POLL_S)
        except asyncio.TimeoutError:
            pass

    def _kill_busy_instances(self, why: str) -> None:
        for mv in self.registry.all_versions():
            if mv.pool is not None:
                for inst in [*mv.pool.instances, *mv.pool.retiring]:
                    if inst.holds_work:
                        inst.kill(why)

    async def serve_forever(self) -> None:
        """Start, run until SIGTERM or SIGINT, then stop gracefully; a second signal ends
        the wait for in-flight requests at once. Under systemd (`Type=notify`) it reports
        READY=1 once every model is loaded and the endpoints are up, STOPPING=1 as the drain
        begins, and pings the watchdog when `WatchdogSec=` asks for it."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():
                log.info("%s received again: in-flight requests now fail", sig.name)
                self.hurry()
                return
            log.info("%s received: shutting down (a second one stops waiting for in-flight "
                     "requests)", sig.name)
            # Readiness goes false with the signal, not when the loop gets to stop().
            self.dataplane.stopping = True
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        watchdog = stopping = None
        try:
            await self._start_unless(stop)
            if not stop.is_set():
                await systemd.notify_patiently("READY=1")
                # systemd's watchdog runs from the end of start-up on.
                watchdog = systemd.start_watchdog()
                await stop.wait()
            # The drain does not wait for a manager that is slow to read.
            stopping = asyncio.ensure_future(systemd.notify_patiently("STOPPING=1"))
            await self.stop()
        finally:
            for task in (watchdog, stopping):
                if task is not None:
                    task.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


# How long stopping endpoints wait for responses still being written, after the drain.
ENDPOINT_GRACE_S = 1.0
DRAIN_POLL_S = 0.05

