"""Loading a repository's models: config, versions, one worker per instance.

A model whose config is bad, or whose instances fail to start, becomes UNAVAILABLE with a
readable reason; the rest of the repository loads regardless.
"""

import asyncio
import logging
import os
import time

from shmserve import proto
from shmserve import registry as reg
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import read_model_config
from shmserve.config.render import config_to_json
from shmserve.dispatch.pool import InstancePool
from shmserve.dispatch.worker import WorkerHandle
from shmserve.errors import Code, ServerError
from shmserve.repository.autocomplete import complete_model_config
from shmserve.repository.scan import scan_repository, select_versions
from shmserve.scheduling.default import DefaultScheduler
from shmserve.scheduling.dynamic import DynamicBatcher
from shmserve.scheduling.sequence import SequenceBatcher
from shmserve.scheduling.strategy import BatchStrategy
from shmserve.signature import ModelSignature

log = logging.getLogger("shmserve.repository")


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes; found without CUDA, which only workers may load."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


class Loader:
    def __init__(self, registry: reg.Registry, repository: str, *, config_name=None,
                 on_instance_exit=None, on_pool_ready=None, disable_auto_complete=False):
        self.registry = registry
        self.repository = os.path.abspath(repository)
        self._config_name = config_name
        self._gpus = gpu_count()
        self._on_instance_exit = on_instance_exit
        self._on_pool_ready = on_pool_ready
        self._auto_complete = not disable_auto_complete

    async def load_all(self, names=None) -> None:
        entries = scan_repository(self.repository)
        if names is not None:
            entries = [e for e in entries if e.name in names]
        await asyncio.gather(*(self.load_model(e) for e in entries))

    async def load_model(self, entry) -> None:
        rec = self.registry.record(entry.name)
        try:
            # Without auto-complete, Triton requires every model to have a config file.
            config = read_model_config(entry.path, self._config_name,
                                       autofill=self._auto_complete)
            if self._auto_complete:
                config = await complete_model_config(entry, config)
            if self._gpus == 0:
                _run_gpu_groups_on_cpu(config, entry.name)
            config = normalize_config(config, entry.name, self._gpus)
            if config.platform == "ensemble":
                raise ServerError(Code.UNSUPPORTED, "ensemble models are not supported yet")
        except ServerError as exc:
            rec.reason = exc.message
            log.error("model '%s' is unavailable: %s", entry.name, exc.message)
            return
        rec.reason = ""
        policy = config.version_policy
        to_load, missing = select_versions(policy, entry.versions)
        for v in missing:
            log.warning("model '%s' version %d is requested by its version policy but absent",
                        entry.name, v)
        await asyncio.gather(*(self._load_version(rec, entry, config, v) for v in to_load))

    async def _load_version(self, rec, entry, config, version: int) -> None:
        started = time.monotonic()
        config_json = config_to_json(config)
        mv = reg.ModelVersion(
            name=entry.name, version=version, config=config, config_json=config_json,
            signature=ModelSignature.from_config(config),
            platform=config.platform or config.backend)
        rec.versions[version] = mv
        workers = []
        for group in config.instance_group:
            kind = _kind_name(group)
            gpus = list(group.gpus) if kind == "GPU" else [0]
            index = 0  # Triton numbers a group's instances across its devices
            for device in gpus:
                for _ in range(group.count):
                    workers.append(WorkerHandle(
                        model_name=entry.name, model_version=version, model_dir=entry.path,
                        model_repository=self.repository, model_config=config_json,
                        instance_name=f"{group.name}_{index}", instance_kind=kind,
                        device_id=device if kind == "GPU" else 0,
                        on_exit=self._on_instance_exit))
                    index += 1
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        pool = InstancePool(workers)
        if not errors:
            try:
                mv.scheduler = _scheduler(config, config_json, pool, mv.stats, entry.path,
                                          version)
            except ServerError as exc:  # a broken batch_strategy.py
                errors.append(exc)
        if errors:
            await asyncio.gather(*(w.stop() for w in workers))
            err = errors[0]
            mv.state = reg.UNAVAILABLE
            mv.reason = err.message if isinstance(err, ServerError) else f"{type(err).__name__}: {err}"
            log.error("model '%s' version %d failed to load: %s", entry.name, version, mv.reason)
            return
        mv.pool = pool
        if self._on_pool_ready is not None:
            self._on_pool_ready(pool)
        mv.state = reg.READY
        mv.load_seconds = time.monotonic() - started
        log.info("model '%s' version %d is ready (%d instance(s), %.2fs)", entry.name, version,
                 len(workers), mv.load_seconds)

    async def unload_all(self) -> None:
        stops = []
        for mv in self.registry.all_versions():
            mv.state = reg.UNLOADING
            if mv.scheduler is not None:
                mv.scheduler.close()
            if mv.pool is not None:
                mv.pool.close()
                stops.extend(w.stop() for w in mv.pool.instances)
        await asyncio.gather(*stops)
        for mv in self.registry.all_versions():
            mv.state = reg.UNAVAILABLE
            mv.reason = "unloaded"


def _scheduler(config, config_json: dict, pool, stats, model_dir: str, version: int):
    if config.HasField("dynamic_batching"):
        strategy = BatchStrategy.find(model_dir, version, config, config_json)
        return DynamicBatcher.from_config(pool, stats, config, strategy)
    if config.HasField("sequence_batching"):
        return SequenceBatcher.from_config(pool, stats, config)
    return DefaultScheduler(pool, stats)


def _run_gpu_groups_on_cpu(config, model_name: str) -> None:
    """With no GPU on the machine, GPU instance groups run on the CPU rather than fail
    (Triton refuses the model; running it is more useful, and the log says so)."""
    for group in config.instance_group:
        if _kind_name(group) == "GPU":
            log.info("model '%s': instance group '%s' asks for a GPU but none exists; "
                     "running it on the CPU", model_name, group.name or "(unnamed)")
            group.kind = proto.ModelInstanceGroup.KIND_CPU
            del group.gpus[:]


def _kind_name(group) -> str:
    fd = group.DESCRIPTOR.fields_by_name["kind"]
    name = fd.enum_type.values_by_number[group.kind].name
    return "GPU" if name == "KIND_GPU" else "CPU"
