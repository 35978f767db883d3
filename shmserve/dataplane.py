"""The one API both transports call: health, metadata, config, statistics, repository,
logging and trace settings, and inference.

An inference request's way is read in order: the transport decodes it (http/, grpc/), the
dataplane finds its model (`infer`, `stream`, `run_step` here), and the lifecycle
(lifecycle.py) admits it (admission.py), schedules and runs it, and answers it
(responses.py).
"""

import asyncio
import contextlib
import logging

from shmserve import __version__, responses
from shmserve.admission import MAX_TENSOR_BYTE_SIZE
from shmserve.errors import Code, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.extensions.response_cache import ResponseCache
from shmserve.inference import InferRequest, InferResponse
from shmserve.lifecycle import Lifecycle
from shmserve.observability import logs
from shmserve.observability.tracing import Tracer, parse_changes
from shmserve.registry import READY, Registry

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
        self.models = models  # a repository.manager.ModelManager: the repository API
        self.shared_memory = shared_memory
        self.server_id = server_id
        self.strict_readiness = strict_readiness
        self.live = False
        self.accepting = False  # false before load and while draining
        self.stopping = False  # a stop began: not ready, though open connections are served
        self.max_tensor_byte_size = max_tensor_byte_size
        self.max_open_streams = max_open_streams
        self.open_streams = 0  # gRPC streams and HTTP event streams open now
        self.lifecycle = Lifecycle(shared_memory, self.tracer,
                                   max_tensor_byte_size=max_tensor_byte_size,
                                   max_queue_size_default=max_queue_size_default,
                                   response_cache=response_cache,
                                   first_response_histogram=first_response_histogram)

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

    def model_control_mode(self) -> str:
        """--model-control-mode: "none", "explicit" or "poll"."""
        return self.models.mode if self.models is not None else "none"

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
    # The transports' entry points: each finds the model and hands the request to the
    # lifecycle (lifecycle.py), which admits, schedules, runs and answers it.

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet answered, of every model: what a drain waits for."""
        return self.lifecycle.in_flight

    def model_directory(self, name: str) -> str | None:
        """The directory of model `name` in the repositories (None without one: a model
        loaded from an upload, or a server without a repository)."""
        if self.models is None:
            return None
        return self.models.model_directory(name)

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
        return await self.lifecycle.infer(request, mv)

    async def stream(self, request: InferRequest):
        """The responses of one request, as an async iterator of StreamedResponse, for any model
        (one that is not decoupled gives exactly one, final). Failures before the first
        response (validation, a full queue, ...) raise ServerError.

        Asking for the next response tells the worker the previous one was consumed, which is
        what bounds a slow reader's buffer; leaving the iteration early cancels the request.
        Use it with `contextlib.aclosing` so that leaving early takes effect at once.
        """
        mv = self._model(request)
        admitted = self.lifecycle.admit(request, mv)
        async with contextlib.aclosing(self.lifecycle.responses(mv, request, admitted)) as items:
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
        admitted = self.lifecycle.admit(request, mv, sample=False)
        work = admitted.work
        for name, piece in output_regions.items():
            work.output_regions[name] = piece
            work.regions.append(piece.region)
        work.device_outputs = device_outputs
        async with contextlib.aclosing(self.lifecycle.responses(mv, request, admitted,
                                                                timings=timings)) as items:
            async for item in items:
                yield item

    def _model(self, request: InferRequest):
        if not self.accepting:
            raise ServerError(Code.UNAVAILABLE, "Server not ready")
        return self.registry.get(request.model_name, request.model_version)


def _check_repository(repository: str) -> None:
    if repository:
        raise ServerError(Code.UNSUPPORTED, "'repository_name' specification is not supported")


class DecoupledModel(ServerError):
    """A one-response API was asked of a decoupled model; each transport words it its way."""
