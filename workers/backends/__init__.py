"""Backends: what a worker runs for a model. docs/backends.md describes the interface.

The front resolves a model's backend (its config's `backend` field, always filled in by then)
and starts one worker per instance; the worker asks this package for that backend's module
and from then on talks to the instance it loads only through the interface below. A backend
module defines:

    load(context: Context) -> Instance
        Load one instance (the model's files, its framework session, ...); BackendError, in
        words the client reading the model's status can act on, when that fails.

    auto_complete(context: AutoCompleteContext) -> dict
        The model's config (Triton's JSON form) completed from the model itself, or unchanged;
        BackendError when the model cannot be read or contradicts its config. Runs in a
        throwaway process (workers/autocomplete.py), before any instance starts.

A Python-based backend (Triton's `<backend directory>/<name>/model.py`) is a `TritonPythonModel`
run by the python module from that folder (Context.runtime_dir).

and its Instance has:

    decoupled: bool      responses go through each request's `respond`, not execute's list
    iterative: bool      requests may be rescheduled (iterative sequence batching)
    has_readiness_hook   whether is_ready() asks the model anything
    execute(requests: list[batch.Request]) -> (list[batch.Response], batch.Timings)
    is_ready() -> bool
    finalize()           unload; BackendError if the model's own finalize fails

A framework is imported only by its backend's module, and that module only in a worker that
runs it: a Python-backend worker never imports onnxruntime.
"""

import importlib
from dataclasses import dataclass, field

# Backend name (a config's `backend`) -> the module that runs it.
_MODULES = {
    "python": "workers.backends.python",
    "onnxruntime": "workers.backends.onnxruntime",
    "pytorch": "workers.backends.pytorch",
}


class BackendError(Exception):
    """A model could not be loaded, completed or finalized; the message says why."""


@dataclass
class Context:
    """What a backend knows of the instance it loads."""
    model_name: str
    model_version: int
    model_dir: str  # the model's folder in the repository (versions are folders in it)
    model_config: dict  # normalized, in Triton's JSON form
    instance_name: str
    instance_kind: str  # "CPU" or "GPU"
    device_id: int
    model_repository: str
    # A sequence model's implicit state: shared memory the front created for this instance
    # (None: on the heap), and its segment's reserve (see workers/sequence_extras.py).
    state_memory: memoryview | None = None
    state_reserve: object = None
    # A Python-based backend's folder, whose model.py runs the model; "" for other models.
    runtime_dir: str = ""


@dataclass
class AutoCompleteContext:
    model_dir: str
    version: str  # the version folder whose files are read
    config: dict  # as written, the backend fields filled in
    # --backend-config settings for this backend, the global ones included
    # (e.g. {"default-max-batch-size": "4"}).
    settings: dict = field(default_factory=dict)
    runtime_dir: str = ""  # as Context.runtime_dir


def backend_name(config: dict) -> str:
    """The module that runs the model: a Python-based backend (`runtime: "model.py"`, whatever
    its name) runs on the Python backend."""
    if config.get("runtime") == "model.py":
        return "python"
    return config.get("backend") or ""


def module_for(name: str):
    """The module that runs backend `name`; BackendError when shmserve has none."""
    module = _MODULES.get(name)
    if module is None:
        # The front refuses such models before starting a worker; this is for a worker
        # started by hand.
        raise BackendError(f"unable to find backend library for backend '{name}', try "
                           "specifying runtime on the model configuration.")
    return importlib.import_module(module)


def load(context: Context):
    """The instance of `context`'s model, loaded by the backend its config names."""
    return module_for(backend_name(context.model_config)).load(context)


def auto_complete(context: AutoCompleteContext) -> dict:
    return module_for(backend_name(context.config)).auto_complete(context)
