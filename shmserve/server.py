"""The server: repository, schedulers, workers and the three endpoints, in one object.

`Server` is also the in-process API (Triton's C API counterpart) for applications that embed
shmserve: `await server.start()`, `await server.infer(InferRequest(...))`, `await server.stop()`.
"""

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from typing import Optional

from aiohttp import web

from shmserve.dataplane import DataPlane
from shmserve.dispatch.supervisor import Supervisor
from shmserve.inference import InferRequest, InferResponse
from shmserve.ipc import shm
from shmserve.registry import Registry
from shmserve.repository.loader import Loader, gpu_count
from shmserve.shared_memory import SharedMemoryManager

log = logging.getLogger("shmserve")


@dataclass
class Options:
    model_repository: list = field(default_factory=list)
    model_control_mode: str = "none"
    load_model: list = field(default_factory=list)
    model_config_name: Optional[str] = None
    disable_auto_complete: bool = False
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
    allow_client_shm: bool = True


class Server:
    def __init__(self, options: Options):
        if len(options.model_repository) != 1:
            raise ValueError("exactly one --model-repository is supported")
        self.options = options
        self.registry = Registry()
        self.shared_memory = SharedMemoryManager(allowed=options.allow_client_shm,
                                                 gpu_count=gpu_count())
        self.dataplane = DataPlane(self.registry, self.shared_memory,
                                   server_id=options.server_id,
                                   strict_readiness=options.strict_readiness)
        self.supervisor = Supervisor()
        self.loader = Loader(self.registry, options.model_repository[0],
                             config_name=options.model_config_name,
                             disable_auto_complete=options.disable_auto_complete,
                             on_instance_exit=self.supervisor.instance_exited,
                             on_pool_ready=self.supervisor.watch)
        self._runners: list = []
        self._grpc = None

    async def start(self) -> None:
        removed = shm.sweep_dead_segments()
        if removed:
            log.info("removed %d shared-memory segment(s) of dead shmserve processes", len(removed))
        opts = self.options
        self.dataplane.live = True
        if opts.model_control_mode == "explicit":
            names = set(opts.load_model)
            await self.loader.load_all(None if "*" in names else names)
        else:
            await self.loader.load_all()
        self.dataplane.accepting = True
        try:
            await self._start_endpoints()
        except BaseException:
            await self.stop()
            raise
        log.info("shmserve ready: %s", ", ".join(self._endpoint_names()))

    async def _start_endpoints(self) -> None:
        opts = self.options
        if opts.allow_http:
            from shmserve.http.app import RUNNER_OPTIONS, build_app
            await self._serve_aiohttp(build_app(self.dataplane, opts.http_max_input_size),
                                      opts.http_address, opts.http_port, **RUNNER_OPTIONS)
        if opts.allow_grpc:
            from shmserve.grpc.servicer import build_server
            self._grpc = build_server(self.dataplane)
            address = f"{_host(opts.grpc_address)}:{opts.grpc_port}"
            if self._grpc.add_insecure_port(address) == 0:
                raise OSError(f"cannot bind gRPC to {address}")
            await self._grpc.start()
        if opts.allow_metrics:
            from shmserve.metrics import build_metrics_app
            await self._serve_aiohttp(build_metrics_app(self.registry), opts.metrics_address,
                                      opts.metrics_port)

    async def _serve_aiohttp(self, app, address: str, port: int, **options) -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, **options)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, address, port, reuse_address=True).start()

    def _endpoint_names(self) -> list:
        o = self.options
        out = []
        if o.allow_http:
            out.append(f"HTTP {o.http_address}:{o.http_port}")
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
        """Refuse new work, let in-flight requests finish (up to --exit-timeout-secs),
        then stop the endpoints and the models; every shared-memory segment is unlinked."""
        self.dataplane.accepting = False
        await self._drain(self.options.exit_timeout_secs)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
            self._grpc = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        await self.supervisor.stop()
        self.shared_memory.unregister_all()
        await self.loader.unload_all()
        self.dataplane.live = False

    async def _drain(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if not any(mv.stats.inflight
                       for mv in self.registry.all_versions()):
                return
            await asyncio.sleep(0.05)

    async def serve_forever(self) -> None:
        """Start, run until SIGTERM or SIGINT, then stop gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        log.info("shutting down")
        await self.stop()


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
