"""Model control, as Triton's --model-control-mode: which models load at start, the
repository load/unload API, and polling the repository for changes.

none: every model loads at start; the API refuses to load or unload.
explicit: the --load-model models load at start ("*": all); then the API decides.
poll: every model loads at start, then every --repository-poll-secs the repository is scanned:
new models load, removed ones unload, changed ones (a file's size or mtime) reload. The API
refuses, as in Triton.

A reload never fails a request: the loader brings the new versions up beside the old ones and
swaps them into the registry in one step; the versions replaced take no new request, finish
the ones they hold (`stats.inflight`), then stop. A reload that changes only instance groups
updates the serving versions' instances in place instead (see instances.py). Operations on one
model are serialized.
"""

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile

from shmserve import registry as reg
from shmserve.config.parse import parse_config_json
from shmserve.errors import Code, ServerError
from shmserve.repository.scan import (ModelEntry, file_marks, find_model, not_unique,
                                      scan_repositories, scan_repository, version_dirs)

log = logging.getLogger("shmserve.repository")

MODES = ("none", "poll", "explicit")
FILE_PREFIX = "file:"
_DRAIN_POLL_S = 0.02


class ModelManager:
    def __init__(self, registry: reg.Registry, loader, *, mode: str = "none",
                 startup_models=(), poll_secs: float = 15.0, drain_timeout: float = 30.0):
        if mode not in MODES:
            raise ValueError(f"unknown model control mode '{mode}'")
        self.registry = registry
        self.loader = loader
        self.mode = mode
        self._startup = set(startup_models)
        self._missing: list = []  # --load-model names not in the repositories (or in several)
        self._not_unique: list = []  # models to load at start found in several repositories
        self._poll_secs = poll_secs
        self._drain_timeout = drain_timeout
        self._locks: dict[str, list] = {}  # model -> [its lock, its users] (_locked)
        self._fingerprints: dict[str, tuple] = {}  # poll mode: each model's files at its load
        self._uploads: dict[str, str] = {}  # model -> temporary directory of its `file:` load
        self._explicit: set = set()  # models loaded by name (not only as an ensemble's step)
        self._retiring: set = set()
        self._poller: asyncio.Task[None] | None = None

    @property
    def repositories(self) -> list[str]:
        return self.loader.repositories

    async def start(self) -> None:
        if self.mode == "explicit":
            names = None if "*" in self._startup else self._startup
        else:
            names = None
        entries, self._not_unique = scan_repositories(self.repositories)
        if names is not None:
            found = {e.name for e in entries}
            self._missing = sorted(n for n in names if n not in found)
            self._not_unique = [n for n in self._not_unique if n in names]
            named = [e for e in entries if e.name in names]
            self._explicit.update(e.name for e in named)
            entries = _with_steps(named, entries, self.loader)
        else:
            self._explicit.update(e.name for e in entries)
        if self.mode == "poll":
            self._fingerprints = {e.name: fingerprint(e.path) for e in entries}
        await self.loader.load_all(entries)
        if self.mode == "poll":
            self._poller = asyncio.ensure_future(self._poll_forever())

    def startup_failures(self) -> list:
        """What failed to load at start, one line each: models of the repository, and
        --load-model names that are not in it (or in several repositories)."""
        out = [not_unique(name) for name in self._not_unique]
        out += [f"failed to load '{name}', failed to poll from model repository"
                for name in self._missing if name not in self._not_unique]
        for rec in self.registry.models.values():
            if rec.reason:
                out.append(f"failed to load '{rec.name}': {rec.reason}")
            for mv in rec.versions.values():
                if mv.state == reg.UNAVAILABLE and mv.reason != reg.UNLOADED:
                    out.append(f"failed to load '{rec.name}' version {mv.version}: {mv.reason}")
        return out

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await self.loader.unload_all()
        for model_dir in self._uploads.values():
            _remove_upload(model_dir)
        self._uploads.clear()

    def repository_names(self) -> list:
        """The models of the repositories, loaded or not, as the index lists them."""
        names: set[str] = set()
        for root in self.repositories:
            try:
                names.update(e.name for e in scan_repository(root))
            except OSError:
                pass
        return sorted(names | set(self.registry.models))

    def model_directory(self, name: str) -> str | None:
        """Model `name`'s directory: its upload's, or the one the repositories hold."""
        return self._uploads.get(name) or find_model(self.repositories, name)

    # -- the load / unload API ---------------------------------------------------------

    async def load(self, name: str, config_json=None, files=None) -> None:
        """Load or reload `name`; returns once it is loaded, raises why it is not.

        `config_json`: a ModelConfig as JSON, in place of config.pbtxt. `files`:
        {"file:<version>/<path>": bytes}, the whole model directory to load from (it then
        needs `config_json`, as in Triton)."""
        _check_name(name)
        self._check_control()
        files = files or {}
        # What a load's parameters get wrong fails Triton's repository poll: its words, then
        # why (which Triton only logs), and 400, as the client's mistake.
        unpolled = f"failed to load '{name}', failed to poll from model repository: "
        if files and config_json is None:
            raise ServerError(Code.INVALID_ARG, f"{unpolled}model files ('file:' parameters) "
                                                "require the 'config' parameter")
        config = None
        if config_json is not None:
            try:
                config = parse_config_json(config_json)
            except ServerError as exc:
                raise ServerError(Code.INVALID_ARG, unpolled + exc.message) from None
            if config.name and config.name != name:
                raise ServerError(Code.INVALID_ARG, f"{unpolled}unexpected directory name "
                                                    f"'{name}' for model '{config.name}', "
                                                    "directory name must equal model name")
        async with self._locked(name):
            upload = _write_upload(name, files) if files else None
            path = upload or find_model(self.repositories, name)
            if path is None:
                raise ServerError(Code.INTERNAL, f"failed to load '{name}', failed to poll "
                                                 f"from model repository")
            entry = ModelEntry(name, path, version_dirs(path))
            await self._load_steps(entry, config, {name})
            error, retired = await self.loader.load_model(entry, config)
            self._explicit.add(name)
            previous_upload = self._uploads.pop(name, None)
            if upload is not None:
                self._uploads[name] = upload
            self._retire(retired, previous_upload)
        if error:
            raise ServerError(Code.INVALID_ARG, f"load failed for model '{name}': {error}\n")

    async def _load_steps(self, entry, config, seen: set) -> None:
        """As in Triton, loading an ensemble loads the models its steps use that are not
        loaded yet; they are not loaded by name (see models_to_unload)."""
        for step in sorted((self.loader.ensemble_steps(entry, config) or set()) - seen):
            rec = self.registry.models.get(step)
            if rec is not None and any(mv.ready for mv in rec.versions.values()):
                continue
            path = find_model(self.repositories, step)
            if path is None:
                continue  # the ensemble's load says which step is missing
            async with self._locked(step):
                step_entry = ModelEntry(step, path, version_dirs(path))
                await self._load_steps(step_entry, None, seen | {step})
                _, retired = await self.loader.load_model(step_entry)
                self._retire(retired)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Start unloading `name` and the ensembles that use it (and, with
        `unload_dependents`, the steps of those ensembles that nothing else uses); as in
        Triton, does not wait for the unload. Unloading a model that is not loaded succeeds,
        whatever its name (only loaded models are looked at: no name leads out of the
        repository; Triton 2.73 checks names only on load)."""
        self._check_control()
        configs = {n: _config(rec) for n, rec in self.registry.models.items()}
        loaded = {n for n, rec in self.registry.models.items()
                  if any(mv.ready for mv in rec.versions.values())}
        for model in models_to_unload(name, configs, loaded, self._explicit, unload_dependents):
            self._explicit.discard(model)
            self._unload_now(model)

    def _unload_now(self, name: str) -> None:
        rec = self.registry.models.get(name)
        if rec is None:
            return
        # Loaded versions have a scheduler (an ensemble's is all it has) until they stop.
        versions = [mv for mv in rec.versions.values()
                    if mv.scheduler is not None and mv.state != reg.UNLOADING]
        for mv in versions:
            mv.state = reg.UNLOADING  # takes no new request from now on
        self._retire(versions, self._uploads.pop(name, None))

    def _check_control(self) -> None:
        if self.mode != "explicit":
            raise ServerError(Code.UNAVAILABLE, "explicit model load / unload is not allowed "
                                                "if polling is enabled")

    @contextlib.asynccontextmanager
    async def _locked(self, name: str):
        """One load or unload of a model at a time. A lock lives while it is used: names
        come from clients, and must not pile up."""
        entry = self._locks.get(name)
        if entry is None:
            entry = self._locks[name] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._locks[name]

    # -- retiring replaced versions ----------------------------------------------------

    def _retire(self, versions: list, upload_dir=None) -> None:
        if not versions and upload_dir is None:
            return
        task = asyncio.ensure_future(self._drain_and_stop(versions, upload_dir))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain_and_stop(self, versions: list, upload_dir) -> None:
        """Requests the versions already hold finish (up to the drain timeout); then their
        workers stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_timeout
        while any(mv.stats.inflight for mv in versions) and loop.time() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        await self.loader.stop_versions(versions)
        for mv in versions:
            log.info("model '%s' version %d is unloaded", mv.name, mv.version)
        if upload_dir is not None:
            _remove_upload(upload_dir)

    # -- poll mode ---------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_secs)
            try:
                await self.poll()
            except Exception:  # a poll that fails must not end polling
                log.exception("polling the model repository failed")

    async def poll(self) -> None:
        """Bring the loaded models in line with the repository."""
        entries = {e.name: e for e in scan_repositories(self.repositories)[0]}
        for name in [n for n in self._fingerprints if n not in entries]:
            del self._fingerprints[name]
            log.info("model '%s' left the repository: unloading it", name)
            self._unload_now(name)
        changed = {}
        for name, entry in entries.items():
            mark = fingerprint(entry.path)
            if self._fingerprints.get(name) != mark:
                self._fingerprints[name] = mark
                changed[name] = entry
        # An ensemble checks its steps as it loads, and is not tried again unless it changes:
        # the changed models its steps use load first (together), then it.
        while changed:
            ready = [entry for entry in changed.values()
                     if not (self.loader.ensemble_steps(entry) or set()) & changed.keys()]
            if not ready:  # steps in a cycle: their loads say what is wrong
                ready = list(changed.values())
            for entry in ready:
                del changed[entry.name]
            await asyncio.gather(*(self._reload(entry) for entry in ready))

    async def _reload(self, entry) -> None:
        async with self._locked(entry.name):
            log.info("model '%s' is new or changed: loading it", entry.name)
            _, retired = await self.loader.load_model(entry)
            self._retire(retired)


def fingerprint(model_dir: str) -> tuple:
    """What a change to a model's directory changes: each file's path, size and mtime."""
    return tuple(file_marks(model_dir, model_dir))


def models_to_unload(name: str, configs: dict, loaded: set, explicit: set,
                     unload_dependents: bool) -> list:
    """The models an unload of `name` takes down, as Triton's dependency graph does: `name`,
    every loaded ensemble that (through its steps) uses a model taken down, and, with
    `unload_dependents`, the steps of the ensembles taken down that no remaining ensemble
    uses and that were not loaded by name. `configs`: model name -> ModelConfig or None."""
    down = {name}
    changed = True
    while changed:
        changed = False
        for model in loaded - down:
            if _steps(configs.get(model)) & down:
                down.add(model)
                changed = True
        if unload_dependents:
            remaining = loaded - down
            used = set().union(*(_steps(configs.get(m)) for m in remaining)) if remaining else set()
            for model in set().union(*(_steps(configs.get(m)) for m in down)):
                if model not in down and model not in used and model not in explicit:
                    down.add(model)
                    changed = True
    return sorted(down)


def _with_steps(named: list, entries: list, loader) -> list:
    """`named` and, as Triton loads them along, the models their ensembles' steps use."""
    by_name = {e.name: e for e in entries}
    chosen = {e.name: e for e in named}
    todo = list(named)
    while todo:
        for step in loader.ensemble_steps(todo.pop()) or ():
            if step in by_name and step not in chosen:
                chosen[step] = by_name[step]
                todo.append(by_name[step])
    return list(chosen.values())


def _steps(config) -> set:
    if config is None or not config.HasField("ensemble_scheduling"):
        return set()
    return {step.model_name for step in config.ensemble_scheduling.step}


def _config(rec):
    for mv in rec.versions.values():
        return mv.config
    return None


def _write_upload(name: str, files: dict) -> str:
    """A temporary model directory holding the files of a load request."""
    root = tempfile.mkdtemp(prefix=f"shmserve-{name}-")
    model_dir = os.path.join(root, name)
    try:
        inside = os.path.realpath(model_dir)
        for key, content in files.items():
            # As Triton: the path is joined to the model's folder as written (a leading "/"
            # too, so "file:/1/model.py" is 1/model.py), and must stay inside it once
            # normalized.
            relative = key[len(FILE_PREFIX):]
            if "\x00" in relative:
                raise ServerError(Code.INVALID_ARG, f"Invalid file parameter '{key}': a path "
                                                    "holds no NUL character")
            path = os.path.realpath(model_dir + "/" + relative)
            if not path.startswith(inside + os.sep):
                raise ServerError(Code.INVALID_ARG, f"Invalid file parameter '{key}' with "
                                                    f"normalized path '{path}' must stay within "
                                                    "model directory.")
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(content)
            except (IsADirectoryError, NotADirectoryError, FileExistsError):
                raise ServerError(Code.INVALID_ARG, f"Invalid file parameter '{key}', "
                                                    "directory has been created as a file"
                                  ) from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return model_dir


def _remove_upload(model_dir: str) -> None:
    shutil.rmtree(os.path.dirname(model_dir), ignore_errors=True)


def _check_name(name: str) -> None:
    """A name the load API takes: a directory of a repository, so never a path out of it
    (INVALID_ARG before anything else is said, in Triton 2.73's words)."""
    trimmed = name.strip()
    if not trimmed:
        raise ServerError(Code.INVALID_ARG,
                          "Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed in (".", "..") or "/" in name or "\x00" in name:
        shown = name if len(name) <= 256 else name[:256] + "..."
        raise ServerError(Code.INVALID_ARG, f"invalid model name '{shown}', model name must "
                                            "not contain path traversal characters")
