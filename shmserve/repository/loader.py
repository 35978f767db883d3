"""Loading a repository's models: config, versions, one worker per instance.

A model whose config is bad, or whose instances fail to start, becomes UNAVAILABLE with a
readable reason; the rest of the repository loads regardless.

Loading a model that is already loaded (a reload) brings the new versions up beside the
serving ones and swaps them into the registry in one step; the versions replaced are handed
back, for the caller to drain and stop (see manager.py). A version that fails to reload keeps
its serving predecessor, and a config that fails to read keeps the model as it was. A reload
whose config changes only the instance groups of a version whose files did not change updates
that version's instances in place instead (see instances.py).
"""

import asyncio
import functools
import logging
import os
import time
from typing import Any, Awaitable, Callable, TypeGuard

from shmserve import proto
from shmserve import registry as reg
from shmserve.config.backend import (DEFAULT_BACKEND_DIRECTORY, backend_settings,
                                     check_backend_fields, check_stub_names,
                                     fill_backend_fields, require_backend, runtime_folder)
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import read_model_config
from shmserve.config.render import config_to_json
from shmserve.dispatch.pool import DEFAULT_PIPELINE_BELOW_US, InstancePool
from shmserve.dispatch.rate_limiter import needs_of
from shmserve.dispatch.worker import WorkerHandle
from shmserve.errors import ServerError, invalid_arg, status_text
from shmserve.extensions.classification import read_labels
from shmserve.ipc.idle_spin import DEFAULT_SPIN_US
from shmserve.ipc.messages import ServerCall
from shmserve.observability.stats import ModelStats, first_response_bounds_ms
from shmserve.observability.summaries import LatencySummaries
from shmserve.repository.config_completion import complete_model_config
from shmserve.repository.python_environments import PythonEnvironments, requested_path
from shmserve.repository.instances import (config_change_requires_reload, kind_name, match,
                                           run_gpu_groups_on_cpu, version_source,
                                           wanted_instances)
from shmserve.repository.scan import select_versions
from shmserve.scheduling.default import DefaultScheduler
from shmserve.scheduling.dynamic import DynamicBatcher
from shmserve.scheduling.ensemble import ENSEMBLE_PLATFORM, EnsemblePlan, EnsembleScheduler
from shmserve.scheduling.sequence import SequenceBatcher
from shmserve.scheduling.strategy import BatchStrategy
from shmserve.signature import ModelSignature

log = logging.getLogger("shmserve.repository")

# How often an instance removed by an instance group update is checked for what it still
# holds (batches, open streams, sequences) before it is stopped.
_RETIRE_POLL_S = 0.02


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes to CUDA here; found without CUDA, which only workers may
    load. Containers that hide /proc/driver/nvidia still have a /dev/nvidiaN node per GPU."""
    try:
        physical = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        try:
            physical = sum(1 for name in os.listdir("/dev")
                           if name.startswith("nvidia") and name[6:].isdigit())
        except OSError:
            physical = 0
    return visible_gpus(physical, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(physical: int, cuda_visible_devices: str | None) -> int:
    """How many of `physical` GPUs CUDA shows under CUDA_VISIBLE_DEVICES: its entries up to
    the first one that names no GPU, as CUDA reads them (unset: all of them)."""
    if cuda_visible_devices is None:
        return physical
    count = 0
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < physical or entry.startswith(("GPU-", "MIG-")):
            count += 1
        else:
            break
    return min(count, physical)


class Loader:
    def __init__(self, registry: reg.Registry, repositories: list[str], *, config_name=None,
                 on_instance_exit=None, on_pool_ready=None, on_pool_stopped=None,
                 on_instance_added=None, on_instance_removed=None,
                 disable_auto_complete=False, load_retries: int = 0,
                 summary_quantiles: tuple = (), rate_limiter=None,
                 worker_spin_us: int = DEFAULT_SPIN_US, front_spin=None,
                 pipeline_below_us: int = DEFAULT_PIPELINE_BELOW_US,
                 gpu_metric_labels: bool = False, backend_config: dict | None = None,
                 backend_directory: str = DEFAULT_BACKEND_DIRECTORY):
        """`load_retries`: how many more times a version that failed to load is tried
        (Triton's --model-load-retry-count); `summary_quantiles`: the quantiles of each
        version's latency summaries, none without --metrics-config summary_latencies;
        `rate_limiter`: the RateLimiter of --rate-limit=execution_count, or None;
        `worker_spin_us`: the workers' polling between batches (--worker-spin-us);
        `front_spin`: the front's polling around batches (a FrontSpin), or None;
        `pipeline_below_us`: how short an instance's batches must be for it to be sent the
        next while it runs one (--pipeline-below-us); `gpu_metric_labels`: whether the
        metrics count GPU instances' work under their GPU's `gpu_uuid` (GPU metrics on).
        `on_instance_added(pool, instance)` and `on_instance_removed(instance)`: an instance
        group update added an instance to a serving pool, or is stopping one it removed.
        `backend_config`: --backend-config settings, {backend or "" for all: {key: value}};
        `backend_directory`: where Python-based backends live (--backend-directory)."""
        self._backend_config = backend_config or {}
        self._backend_directory = backend_directory
        self._gpu_metric_labels = gpu_metric_labels
        self._rate_limiter = rate_limiter
        self._pipeline_below_us = pipeline_below_us
        self._worker_spin_us = worker_spin_us
        self._front_spin = front_spin
        self._summary_quantiles = summary_quantiles
        self.registry = registry
        self.repositories = [os.path.abspath(root) for root in repositories]
        self._config_name = config_name
        self._gpus = gpu_count()
        self._on_instance_exit = on_instance_exit
        self._on_pool_ready = on_pool_ready
        self._on_pool_stopped = on_pool_stopped
        self._on_instance_added = on_instance_added
        self._on_instance_removed = on_instance_removed
        # The models' own Python environments (EXECUTION_ENV_PATH).
        self._environments = PythonEnvironments()
        # Instances an update removed, until they are stopped -> the task that stops them.
        self._retirements: dict = {}
        self._auto_complete = not disable_auto_complete
        self.load_retries = load_retries
        # Runs an ensemble's steps (DataPlane.run_step); set by the server.
        self.step_runner: Callable[..., Any] | None = None
        # Serves the models' calls into the server (model_calls.ServerCalls); set by the server.
        self.server_calls: Callable[[WorkerHandle, ServerCall], None] | None = None
        # Runs a version's model_warmup samples on a started instance: warm_up(mv, instance,
        # model_dir), raising ServerError (set by the server: shmserve/warmup.py).
        self.warm_up: Callable[..., Awaitable[None]] | None = None

    async def load_all(self, entries: list) -> None:
        """Load the models of `entries` (ModelEntry), each ensemble after its steps."""
        # Ensembles load after the models they use: checking one needs its steps' configs.
        steps = {e.name: self.ensemble_steps(e) for e in entries}
        await asyncio.gather(*(self.load_model(e) for e in entries if steps[e.name] is None))
        pending = [e for e in entries if steps[e.name] is not None]
        while pending:
            waiting = {e.name for e in pending}
            now = [e for e in pending if not steps[e.name] & waiting]
            if not now:
                for e in pending:
                    self.registry.record(e.name).reason = (
                        f"circular dependency between ensembles: {', '.join(sorted(waiting))}")
                    log.error("model '%s' is unavailable: its steps use ensembles in a cycle",
                              e.name)
                return
            await asyncio.gather(*(self.load_model(e) for e in now))
            pending = [e for e in pending if e not in now]

    def ensemble_steps(self, entry, config=None):
        """The models an ensemble's steps use (its config: `config`, or its config file);
        None for a model that is not an ensemble (or whose config cannot be read, which
        load_model reports)."""
        if config is None:
            try:
                config = read_model_config(entry.path, self._config_name, autofill=True)
            except ServerError:
                return None
        if config.platform != ENSEMBLE_PLATFORM:
            return None
        return {step.model_name for step in config.ensemble_scheduling.step}

    async def load_model(self, entry, config=None) -> tuple[str, list]:
        """Load or reload the model of `entry`, configured by its config file or by `config`
        (a ModelConfig that replaces the file). Returns why it failed ("" when every version
        its policy selects is ready) and the versions the registry no longer routes to."""
        rec = self.registry.record(entry.name)
        plan = None
        read = None
        try:
            read = await self._read_config(entry, config)
            config = self._normalize(read, entry.name)
            if config.backend == "python":
                check_stub_names(config, self._auto_complete)
            if config.platform == ENSEMBLE_PLATFORM:
                plan = EnsemblePlan.build(config, functools.partial(self._step_config,
                                                                    entry.name))
                # As Triton: an ensemble with a decoupled step is decoupled.
                config.model_transaction_policy.decoupled = plan.decoupled
        except ServerError as exc:
            log.error("model '%s' is unavailable: %s", entry.name, exc.message)
            # A config that reads but does not validate fails each version the policy
            # selects, as in Triton; one that does not read fails the model.
            versions = (_policy_versions(read, entry)
                        if read is not None and read.platform != ENSEMBLE_PLATFORM else ())
            reason = status_text(exc) if versions else exc.message
            if not any(v.ready for v in rec.versions.values()):
                rec.reason, rec.reason_versions = reason, versions
            return (_version_failures((v, reason) for v in versions) if versions
                    else exc.message), []
        rec.reason, rec.reason_versions = "", ()
        to_load, missing = select_versions(config.version_policy, entry.versions)
        for v in missing:
            log.warning("model '%s' version %d is requested by its version policy but absent",
                        entry.name, v)
        updates: dict = {}  # version updated in place -> why it failed, "" if it did not
        if plan is not None:
            loaded = [self._ensemble_version(entry, config, plan, v) for v in to_load]
        else:
            jobs: list[Awaitable[reg.ModelVersion | str]] = []
            updated: dict[int, reg.ModelVersion] = {}
            for v in to_load:
                source = version_source(entry.path, v, self._config_name)
                serving = rec.versions.get(v)
                if _updatable(serving, config, source):
                    updated[v] = serving
                    jobs.append(self._update_version(entry, serving, config, source))
                else:
                    jobs.append(self._load_version(rec, entry, config, v, source))
            results = await asyncio.gather(*jobs)
            # An update in place answers why it failed ("" if it did not), a load the version.
            loaded = [updated[v] if isinstance(result, str) else result
                      for v, result in zip(to_load, results)]
            updates = {v: result for v, result in zip(to_load, results)
                       if isinstance(result, str)}
            for attempt in range(1, self.load_retries + 1):
                failed = [i for i, mv in enumerate(loaded)
                          if not mv.ready and mv.version not in updates]
                if not failed:
                    break
                log.info("model '%s': retrying the load of version(s) %s (%d of %d)",
                         entry.name, ", ".join(str(loaded[i].version) for i in failed),
                         attempt, self.load_retries)
                again = await asyncio.gather(*(self._load_version(rec, entry, config,
                                                                  loaded[i].version,
                                                                  loaded[i].source)
                                               for i in failed))
                for i, mv in zip(failed, again):
                    loaded[i] = mv
        retired = _install(rec, loaded)
        if not loaded:
            return (f"at least one version must be available under the version policy of "
                    f"model '{entry.name}'"), retired
        failures: list[tuple[int, str] | tuple[int, str, str]] = []
        for mv in loaded:
            if mv.version in updates:
                if updates[mv.version]:  # it serves on (if it still can) as it was
                    failures.append((mv.version, updates[mv.version], mv.state))
            elif not mv.ready:
                failures.append((mv.version, mv.reason))
        if not failures:
            # Triton's line, which its tests and users' log scrapers look for
            log.info("successfully loaded '%s'", entry.name)
        return _version_failures(failures), retired

    async def _read_config(self, entry, config):
        """The model's config as given or read (and auto-completed), not yet validated."""
        if config is None:
            # Without auto-complete, Triton requires every model to have a config file.
            config = read_model_config(entry.path, self._config_name,
                                       autofill=self._auto_complete)
        fill_backend_fields(config, entry.path, entry.name)
        # Before the backend runs anything: a mismatch, or a backend that cannot run here,
        # is told as such rather than as whatever auto-complete would make of it.
        check_backend_fields(config)
        require_backend(config, self._backend_directory)
        if self._auto_complete:
            config = await complete_model_config(
                entry, config, backend_settings(self._backend_config, config.backend),
                runtime_dir=runtime_folder(config.runtime, config.backend,
                                           self._backend_directory),
                environment=functools.partial(self._environment, config, entry.path))
        return config

    async def _environment(self, config, model_dir: str):
        """The model's own Python environment (EXECUTION_ENV_PATH) made ready, or None;
        ServerError (INTERNAL) if it cannot serve."""
        path = requested_path(config, model_dir)
        if not path:
            return None
        return await asyncio.to_thread(self._environments.prepare, path)

    def _normalize(self, config, name: str):
        if self._gpus == 0:
            run_gpu_groups_on_cpu(config, name)
        return normalize_config(config, name, self._gpus)

    def _step_config(self, ensemble: str, name: str, version: int):
        """The config of the model an ensemble step uses, in Triton's words when it has no
        ready version (that version, for a step that names one)."""
        rec = self.registry.models.get(name)
        if rec is None:
            raise invalid_arg(f"ensemble {ensemble} contains models that are not available or "
                              f"ambiguous: {name}")
        ready = {mv.version: mv for mv in rec.versions.values() if mv.ready}
        if not ready:
            why = rec.reason or next((mv.reason for mv in rec.versions.values() if mv.reason),
                                     "")
            raise invalid_arg(f"ensemble '{ensemble}' depends on '{name}' which has no loaded "
                              f"version" + (f". Model '{name}' loading failed with error: {why}"
                                            if why else ""))
        if version < 0:
            return ready[max(ready)].config
        if version not in ready:
            raise invalid_arg(f"ensemble '{ensemble}' depends on '{name}' whose required "
                              f"version {version} is not loaded.")
        return ready[version].config

    def _ensemble_version(self, entry, config, plan, version: int) -> reg.ModelVersion:
        """An ensemble's version: no instances, only a scheduler that runs its steps."""
        mv = reg.ModelVersion(
            name=entry.name, version=version, config=config,
            config_json=config_to_json(config), signature=ModelSignature.from_config(config),
            platform=ENSEMBLE_PLATFORM, stats=self._new_stats(config))
        assert self.step_runner is not None  # the server sets it before it loads models
        mv.scheduler = EnsembleScheduler(plan, self.step_runner, mv.stats)
        mv.state = reg.READY
        log.info("ensemble '%s' version %d is ready (steps: %s)", entry.name, version,
                 ", ".join(step.model_name for step in plan.steps))
        return mv

    def _new_stats(self, config) -> ModelStats:
        summaries = LatencySummaries(self._summary_quantiles) if self._summary_quantiles \
            else None
        return ModelStats(summaries=summaries,
                          first_response_bounds_ms=first_response_bounds_ms(config),
                          per_device=self._gpu_metric_labels)

    async def _load_version(self, rec, entry, config, version: int,
                            source: tuple = ()) -> reg.ModelVersion:
        started = time.monotonic()
        config_json = config_to_json(config)
        mv = reg.ModelVersion(
            name=entry.name, version=version, config=config, config_json=config_json,
            signature=ModelSignature.from_config(config),
            platform=config.platform or config.backend, stats=self._new_stats(config),
            instance_config_json=config_json, source=source)
        # A new version shows as LOADING; a reloaded one keeps serving until the swap.
        rec.versions.setdefault(version, mv)
        try:
            mv.labels = read_labels(entry.path, config)
        except ServerError as exc:
            mv.state = reg.UNAVAILABLE
            mv.reason = status_text(exc)
            log.error("model '%s' version %d failed to load: %s", entry.name, version, mv.reason)
            return mv
        try:
            environment = await self._environment(config, entry.path)
        except ServerError as exc:  # a version's failure, as in Triton
            mv.state = reg.UNAVAILABLE
            mv.reason = status_text(exc)
            log.error("model '%s' version %d failed to load: %s", entry.name, version, mv.reason)
            return mv
        workers = [self._new_worker(entry, version, config_json, want, environment)
                   for want in wanted_instances(config, kind_name)]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            errors = await self._warm_up(mv, workers, entry.path)
        limiter = self._rate_limiter
        pool = InstancePool(workers, limiter=limiter if limiter is not None
                            and any(limiter.limits(w) for w in workers) else None,
                            pipeline_below_us=self._pipeline_below_us)
        if not errors:
            try:
                mv.scheduler = _scheduler(config, config_json, pool, mv.stats, entry.path,
                                          version)
            except ServerError as exc:  # a broken batch_strategy.py
                errors.append(exc)
        if errors:
            pool.close()
            await asyncio.gather(*(w.stop() for w in workers))
            err = errors[0]
            mv.state = reg.UNAVAILABLE
            mv.reason = (status_text(err) if isinstance(err, ServerError)
                         else f"Internal: {type(err).__name__}: {err}")
            log.error("model '%s' version %d failed to load: %s", entry.name, version, mv.reason)
            return mv
        mv.pool = pool
        if self._on_pool_ready is not None:
            self._on_pool_ready(pool)
        mv.state = reg.READY
        mv.load_seconds = time.monotonic() - started
        log.info("model '%s' version %d is ready (%d instance(s), %.2fs)", entry.name, version,
                 len(workers), mv.load_seconds)
        return mv

    async def _warm_up(self, mv, workers: list, model_dir: str) -> list:
        """The errors of warming up started instances (none without model_warmup)."""
        if not mv.config.model_warmup or self.warm_up is None:
            return []
        results = await asyncio.gather(*(self.warm_up(mv, w, model_dir) for w in workers),
                                       return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]

    def _new_worker(self, entry, version: int, config_json: dict, want,
                    environment) -> WorkerHandle:
        """The (not yet started) instance `want` (instances.Wanted) of a version, run in the
        model's own Python `environment` if it has one."""
        worker = WorkerHandle(
            model_name=entry.name, model_version=version, model_dir=entry.path,
            model_repository=entry.path, model_config=config_json, instance_name=want.name,
            runtime_dir=runtime_folder(config_json.get("runtime", ""),
                                       config_json.get("backend", ""), self._backend_directory),
            instance_kind=want.kind, device_id=want.device, on_exit=self._on_instance_exit,
            on_server_call=self.server_calls, spin_us=self._worker_spin_us,
            front_spin=self._front_spin, environment=environment)
        worker.signature = want.signature  # what an instance group update matches it by
        if self._rate_limiter is not None:
            needs = needs_of(want.group, want.device)
            if needs is not None:
                self._rate_limiter.add(worker, needs)
        return worker

    async def _update_version(self, entry, mv, config, source: tuple) -> str:
        """Bring a serving version's instances in line with `config`, which differs from its
        own in instance groups only: start the instances it lacks, then serve with them and
        the kept ones, then stop those no longer wanted once they hold nothing. Returns ""
        or, when new instances failed to start, why (the version then serves as before)."""
        mv.reason = ""
        pool = mv.pool
        wanted = wanted_instances(config, kind_name)
        chosen, removed = match(wanted, pool.instances, lambda inst: inst.signature)
        environment = None
        if any(inst is None for inst in chosen):
            try:
                environment = await self._environment(mv.config, entry.path)
            except ServerError as exc:
                mv.reason = status_text(exc)
                return mv.reason
        added = [self._new_worker(entry, mv.version, mv.instance_config_json, want, environment)
                 for want, inst in zip(wanted, chosen) if inst is None]
        if added:
            log.info("model '%s' version %d: starting instance(s) %s", entry.name, mv.version,
                     ", ".join(w.instance_name for w in added))
        results = await asyncio.gather(*(w.start() for w in added), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            errors = await self._warm_up(mv, added, entry.path)
        if errors or mv.state != reg.READY or pool.closed:
            await asyncio.gather(*(w.stop() for w in added))
            if self._rate_limiter is not None:
                for w in added:
                    self._rate_limiter.remove(w)
            if not errors:
                return "unloaded while its instances were being updated"
            err = errors[0]
            mv.reason = (status_text(err) if isinstance(err, ServerError)
                         else f"Internal: {type(err).__name__}: {err}")
            log.error("model '%s' version %d: its instance update failed, it serves as before: "
                      "%s", entry.name, mv.version, mv.reason)
            return mv.reason
        # As Triton orders its instances: the kept ones as claimed, then the new ones.
        retired = pool.update([inst for inst in chosen if inst is not None] + added,
                              limiter=self._rate_limiter)
        scheduler = mv.scheduler
        if hasattr(scheduler, "add_instances"):  # the sequence batcher binds slots to them
            scheduler.add_instances(added)
            scheduler.retire_instances(retired)
        for w in added:
            if self._on_instance_added is not None:
                self._on_instance_added(pool, w)
        updated = type(mv.config)()
        updated.CopyFrom(mv.config)
        del updated.instance_group[:]
        updated.instance_group.extend(config.instance_group)
        mv.config = updated
        mv.config_json = config_to_json(updated)
        mv.source = source
        holds = getattr(scheduler, "holds_sequences", None)
        waits = []
        for inst in retired:
            task = asyncio.ensure_future(self._retire_instance(mv, pool, inst, holds))
            self._retirements[inst] = task
            # As in Triton, the load waits for the removed instances, except those that hold
            # sequences: they stop once their sequences end.
            if holds is None or not holds(inst):
                waits.append(task)
        await asyncio.gather(*waits, return_exceptions=True)
        log.info("model '%s' version %d: instances updated in place (%d kept, %d added, "
                 "%d removed)", entry.name, mv.version, len(chosen) - len(added), len(added),
                 len(retired))
        return ""

    async def _retire_instance(self, mv, pool, inst, holds_sequences) -> None:
        """Stop an instance an update removed once it holds nothing (or its pool closed)."""
        try:
            while not pool.closed and (pool.busy(inst) or inst.holds_work or (
                    holds_sequences is not None and holds_sequences(inst))):
                await asyncio.sleep(_RETIRE_POLL_S)
            if self._on_instance_removed is not None:
                self._on_instance_removed(inst)
            await inst.stop()
            log.info("model '%s' version %d: instance '%s' removed", mv.name, mv.version,
                     inst.instance_name)
        finally:
            pool.forget(inst)
            self._retirements.pop(inst, None)

    async def stop_versions(self, versions) -> None:
        """Stop the workers of versions that no longer take requests; they become
        UNAVAILABLE, reason "unloaded", as Triton shows unloaded versions."""
        stops: list[Awaitable[None]] = []
        for mv in versions:
            mv.state = reg.UNLOADING
            if mv.scheduler is not None:
                mv.scheduler.close()
            if mv.pool is not None:
                if self._on_pool_stopped is not None:
                    self._on_pool_stopped(mv.pool)
                mv.pool.close()
                stops.extend(w.stop() for w in mv.pool.instances)
                # Instances an update removed stop now that their pool is closed.
                stops.extend(self._retirements[w] for w in mv.pool.retiring
                             if w in self._retirements)
        await asyncio.gather(*stops)
        for mv in versions:
            mv.state = reg.UNAVAILABLE
            mv.reason = reg.UNLOADED
            mv.pool = None
            mv.scheduler = None
            log.info("successfully unloaded '%s' version %d", mv.name, mv.version)  # Triton's

    async def unload_all(self) -> None:
        """Every version stopped, and the Python environments unpacked for them removed."""
        await self.stop_versions(list(self.registry.all_versions()))
        await asyncio.to_thread(self._environments.close)


def _install(rec, loaded: list) -> list:
    """Put the freshly loaded versions in the registry in one step; returns the versions
    that were serving and are not any more, marked UNLOADING."""
    old = rec.versions
    new = {}
    for mv in loaded:
        previous = old.get(mv.version)
        if not mv.ready and previous is not None and previous is not mv and previous.ready:
            new[mv.version] = previous  # a failed reload keeps the version that serves
        else:
            new[mv.version] = mv
    for version, mv in old.items():
        if version not in new:  # no longer selected: listed until it is unloaded
            new[version] = mv
    selected = {mv.version for mv in loaded}
    retired = [mv for mv in old.values() if mv.scheduler is not None
               and (mv.version not in selected or new[mv.version] is not mv)]
    for mv in retired:
        mv.state = reg.UNLOADING
    rec.versions = new
    return retired


def _updatable(serving: reg.ModelVersion | None, config, source: tuple
               ) -> TypeGuard[reg.ModelVersion]:
    """Whether a reload of the version `serving` (or None) to `config`, its files now being
    `source`, updates its instances in place rather than loading it anew (as Triton decides
    in its ModelLifeCycle::AsyncLoad): it serves, is no ensemble, its files are unchanged, and
    its config differs in instance groups or version policy at most. A version none of whose
    instances runs (all died, and are being restarted) loads anew."""
    return (serving is not None and serving.ready and serving.pool is not None
            and not serving.pool.closed and serving.source == source
            and not config_change_requires_reload(serving.config, config))


def _scheduler(config, config_json: dict, pool, stats, model_dir: str, version: int):
    if config.HasField("dynamic_batching"):
        strategy = BatchStrategy.find(model_dir, version, config, config_json)
        return DynamicBatcher.from_config(pool, stats, config, strategy)
    if config.HasField("sequence_batching"):
        return SequenceBatcher.from_config(pool, stats, config)
    return DefaultScheduler(pool, stats)


def _policy_versions(config, entry) -> tuple:
    """The versions of `entry` that the version policy of `config` (not validated) selects;
    Triton's default policy is the latest one."""
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") is None:
        policy = proto.ModelVersionPolicy()
        policy.latest.num_versions = 1
    return tuple(select_versions(policy, entry.versions)[0])


def _version_failures(failures) -> str:
    """Why versions failed to load, as Triton's load error lists them: "" when none did.
    `failures`: (version, reason) or (version, reason, its state now) (a version whose
    instance update failed is still READY)."""
    return "".join(f"version {failure[0]} is at "
                   f"{failure[2] if len(failure) > 2 else reg.UNAVAILABLE} state: {failure[1]};"
                   for failure in failures)
