"""A model's config completed by its backend at load, as Triton does: a Python model's
`TritonPythonModel.auto_complete_config`, an ONNX model's inputs, outputs and batching (a
TorchScript model has nothing to complete).

The backend runs in a throwaway process (`python -m workers.autocomplete`), as Triton's Python
backend runs a throwaway stub: the front never imports model code or a framework, and nothing
the model or its framework sets up survives into the instances.
"""

import asyncio
import json
import logging
import os
import time
from typing import Awaitable, Callable

from shmserve.config.backend import PYTHON_RUNTIME
from shmserve.config.parse import parse_config_json
from shmserve.config.render import config_to_json
from shmserve.dispatch.worker_process import PythonEnvironment, worker_command, worker_env
from shmserve.errors import ServerError, invalid_arg
from shmserve.proto import ModelConfig
from shmserve.repository.scan import ModelEntry, select_versions

log = logging.getLogger("shmserve.repository")

TIMEOUT_SECONDS = 60.0
# Probing a Python model costs a Python start plus the model's imports, and few models define
# the method: only a model file that names it is probed. A TritonPythonModel that inherits
# auto_complete_config from a base class in another file is therefore not completed; its
# config.pbtxt must be whole.
METHOD_NAME = b"auto_complete_config"


def needs_completion(config: ModelConfig, version_dir: str, runtime_dir: str = "") -> bool:
    """Whether the backend of `config` has anything to complete for this model (`runtime_dir`:
    the folder of its Python-based backend, if it has one)."""
    if runtime_dir:
        return _mentions_method(os.path.join(runtime_dir, PYTHON_RUNTIME))
    if config.backend == "python":
        return _mentions_method(os.path.join(version_dir,
                                             config.default_model_filename or "model.py"))
    if config.backend == "onnxruntime":
        # As Triton's onnxruntime backend: a config that lists inputs (or batch inputs) and
        # outputs is taken as it is.
        return not ((config.input or config.batch_input) and config.output)
    if config.backend == "pytorch":
        # Triton's words: a TorchScript file keeps no shapes to complete a config from.
        log.warning("skipping model configuration auto-complete for '%s': not supported for "
                    "pytorch backend", config.name)
    return False


async def complete_model_config(entry: ModelEntry, config: ModelConfig,
                                settings: dict | None = None, runtime_dir: str = "",
                                environment: Callable[[], Awaitable[PythonEnvironment | None]]
                                | None = None) -> ModelConfig:
    """`config` as completed by the model's backend; `config` itself when there is nothing
    to complete. INVALID_ARG, naming the model, if it fails. `settings`: the backend's
    --backend-config settings; `runtime_dir`: the folder of its Python-based backend;
    `environment`: makes the model's own Python environment ready, when completing needs it."""
    # Triton completes the config while loading the model's first version; we take the highest
    # version the config's policy selects, which under the default policy (latest 1) is the
    # only one loaded. A policy that auto_complete_config itself sets cannot be honoured here.
    if config.HasField("version_policy"):
        versions, _ = select_versions(config.version_policy, entry.versions)
    else:
        versions = entry.versions
    if not versions:
        return config
    version = versions[-1]
    if not needs_completion(config, os.path.join(entry.path, str(version)), runtime_dir):
        return config
    return await auto_complete(entry.path, version, config, settings=settings,
                               runtime_dir=runtime_dir,
                               environment=await environment() if environment else None)


async def auto_complete(model_dir: str, version: int, config: ModelConfig, *,
                        settings: dict | None = None, runtime_dir: str = "",
                        timeout: float = TIMEOUT_SECONDS,
                        environment: PythonEnvironment | None = None) -> ModelConfig:
    """Runs the auto-complete of `config`'s backend on `<model_dir>/<version>` in a child
    process (in the model's own Python `environment`, if it has one), which is killed after
    `timeout` seconds."""
    name = config.name or os.path.basename(model_dir)
    given = config_to_json(config)
    given["name"] = name  # Triton names the model in the config it hands over
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *worker_command("workers.autocomplete", model_dir, str(version),
                        json.dumps(settings or {}), runtime_dir, environment=environment),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=worker_env(environment))
    try:
        out, err = await asyncio.wait_for(
            process.communicate(json.dumps(given).encode()), timeout)
    except TimeoutError:
        what = ("auto_complete_config" if config.backend == "python"
                else f"the {config.backend} backend's auto-complete")
        raise _failed(name, f"{what} did not return within {timeout:g} s") from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise _failed(name, lines[-1] if lines else
                      f"the auto-complete process exited with status {process.returncode}")
    try:
        completed = parse_config_json(out.decode(errors="replace"))
    except ServerError as exc:
        raise _failed(name, f"auto-complete returned a bad configuration: "
                            f"{exc.message}") from None
    log.info("model '%s': the %s backend completed its configuration in %.2fs", name,
             config.backend, time.monotonic() - started)
    return completed


def _mentions_method(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return METHOD_NAME in f.read()
    except OSError:
        return False  # the instances report a missing or unreadable model file


def _failed(name: str, reason: str) -> ServerError:
    return invalid_arg(f"failed to auto-complete the configuration of model '{name}': {reason}")
