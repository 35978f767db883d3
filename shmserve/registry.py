"""The loaded models: (name, version) -> config, signature, scheduler and instance pool."""

import functools
from dataclasses import dataclass, field
from typing import Optional

from shmserve.dispatch.pool import InstancePool
from shmserve.errors import Code, ServerError
from shmserve.observability.stats import ModelStats
from shmserve.scheduling.protocol import Scheduler
from shmserve.signature import ModelSignature

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
# The reason Triton gives for a version that was loaded and is not any more.
UNLOADED = "unloaded"


@dataclass
class ModelVersion:
    name: str
    version: int
    config: object  # normalized inference.ModelConfig
    config_json: dict  # the config as the /config endpoint renders it
    signature: ModelSignature
    platform: str
    state: str = LOADING
    reason: str = ""
    pool: Optional[InstancePool] = None
    scheduler: Optional[Scheduler] = None
    stats: ModelStats = field(default_factory=ModelStats)
    load_seconds: float = 0.0
    labels: dict = field(default_factory=dict)  # output name -> its label_filename's labels
    # The config its instances are given (args["model_config"]): the one it loaded with, also
    # for instances an instance group update adds, as Triton's Python backend does.
    instance_config_json: Optional[dict] = None
    # Its files as loaded (repository/instances.py version_source): unchanged, a reload that
    # changes only instance groups updates the version in place.
    source: tuple = ()

    @property
    def ready(self) -> bool:
        """Requests may be routed to it: loaded, with at least one instance running."""
        return self.state == READY and (self.pool is None or self.pool.ready)

    @property
    def healthy(self) -> bool:
        """What readiness reports: loaded, with every instance running (false while one is
        down or restarting, though `ready` lets the others serve)."""
        return self.state == READY and (self.pool is None or self.pool.all_alive)

    @property
    def decoupled(self) -> bool:
        return self.config.model_transaction_policy.decoupled

    @functools.cached_property
    def answers_in_worker(self) -> bool:
        """Its instance's worker may write a request's prepared answer (see
        workers/prepared_answers.py): one worker runs the request and nothing in the front changes
        the response on its way. Not for ensembles, sequences or decoupled models; not
        where responses must leave in request order across instances (preserve_ordering),
        where the front caches them, or where it reshapes outputs."""
        config = self.config
        return (not self.decoupled
                and not config.HasField("ensemble_scheduling")
                and not config.HasField("sequence_batching")
                and not config.dynamic_batching.preserve_ordering
                and not config.response_cache.enable
                and all(spec.reshape is None for spec in self.signature.outputs.values()))


@dataclass
class ModelRecord:
    name: str
    versions: dict = field(default_factory=dict)  # int -> ModelVersion
    # Why the model as a whole could not load (a bad config, say); "" when it did.
    reason: str = ""
    # The versions `reason` applies to: a config that does not validate fails the versions
    # its policy selects (Triton lists them); () for a model-wide failure.
    reason_versions: tuple = ()


class Registry:
    def __init__(self):
        self.models: dict[str, ModelRecord] = {}
        # The custom metric families (pb_utils.MetricFamily) models declared: name ->
        # (kind, description). As in Triton's registry, a name keeps its first kind and
        # description for the server's life, whichever model declared it.
        self.metric_families: dict[str, tuple[int, str]] = {}

    def declare_metric_family(self, name: str, description: str, kind: int) -> None:
        """Raises INVALID_ARG, in the words of Triton's registry, when `name` has another
        kind."""
        known = self.metric_families.setdefault(name, (kind, description))
        if known[0] != kind:
            raise ServerError(Code.INVALID_ARG, "Family name already exists with different type")

    def record(self, name: str) -> ModelRecord:
        rec = self.models.get(name)
        if rec is None:
            rec = self.models[name] = ModelRecord(name)
        return rec

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The ready version a request addresses; raises Triton's NOT_FOUND/UNAVAILABLE.

        No version (or -1) means the highest ready version.
        """
        mv = self.find(name, version)
        if mv is None:
            failed = self.models[name].reason_versions  # its config did not validate
            if failed and version in ("", "-1"):
                raise ServerError(Code.NOT_FOUND, f"Request for unknown model: '{name}' has no "
                                                  f"available versions")
            if failed and version.isdigit() and int(version) in failed:
                raise ServerError(Code.UNAVAILABLE, f"Request for unknown model: '{name}' "
                                                    f"version {version} is not at ready state")
            raise ServerError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if not mv.ready:
            if mv.state == READY:  # loaded, but every instance is restarting
                raise ServerError(Code.UNAVAILABLE, f"model '{name}' version {mv.version} has no "
                                                    f"running instance (restarting)")
            if version in ("", "-1"):
                raise ServerError(Code.NOT_FOUND, f"Request for unknown model: '{name}' has no available versions")
            raise ServerError(Code.UNAVAILABLE, f"Request for unknown model: '{name}' version {mv.version} is not at ready state")
        return mv

    def find(self, name: str, version: str = "") -> Optional[ModelVersion]:
        """The version addressed, ready or not; None for a known model without versions
        (one whose config could not be read or did not validate)."""
        rec = self.models.get(name)
        if rec is None:
            raise ServerError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        versions = rec.versions
        if not versions:
            return None
        if version in ("", "-1"):
            if len(versions) == 1:  # the usual case, asked of every request
                for only in versions.values():
                    return only
            ready = [v for v in versions.values() if v.ready]
            return max(ready or versions.values(), key=lambda v: v.version)
        try:
            number = int(version)
        except ValueError:
            raise ServerError(Code.INVALID_ARG,
                              f"failed to get model version from specified version string "
                              f"'{version}' (details: stol), version should be an integral "
                              f"value > 0") from None
        mv = versions.get(number)
        if mv is None:
            raise ServerError(Code.NOT_FOUND, f"Request for unknown model: '{name}' version {number} is not found")
        return mv

    def all_versions(self):
        for rec in self.models.values():
            yield from rec.versions.values()

    def all_ready(self) -> bool:
        """Every model that should serve does: unloaded versions do not count."""
        return all(not rec.reason for rec in self.models.values()) and all(
            v.healthy for v in self.all_versions() if v.reason != UNLOADED)
