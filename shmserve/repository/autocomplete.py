"""A Python model's `TritonPythonModel.auto_complete_config`, run at load as Triton does.

The model is imported in a throwaway process (`python -m workers.autocomplete`), as Triton's
Python backend runs it in a throwaway stub: the front never imports model code, and nothing
the import sets up survives into the instances.
"""

import asyncio
import json
import logging
import os
import time

from shmserve.config.normalize import PYTHON_BACKEND
from shmserve.config.parse import parse_config_json
from shmserve.config.render import config_to_json
from shmserve.dispatch.worker import worker_command, worker_env
from shmserve.errors import ServerError, invalid_arg
from shmserve.proto import ModelConfig
from shmserve.repository.scan import ModelEntry, select_versions

log = logging.getLogger("shmserve.repository")

TIMEOUT_SECONDS = 60.0
DEFAULT_MODEL_FILENAME = "model.py"
# Probing costs a Python start plus the model's imports, and few models define the method: only
# a model file that names it is probed. A TritonPythonModel that inherits auto_complete_config
# from a base class in another file is therefore not completed; its config.pbtxt must be whole.
METHOD_NAME = b"auto_complete_config"


def fill_backend_fields(config: ModelConfig, model_dir: str) -> None:
    """Triton's server-side autofill, for the Python backend: a config that names no backend
    and no platform runs on "python" when its default_model_filename is model.py, or, with no
    filename either, when the first version directory (in name order) holds a model.py."""
    if config.backend or config.platform:
        return
    if config.default_model_filename:
        if config.default_model_filename == DEFAULT_MODEL_FILENAME:
            config.backend = PYTHON_BACKEND
        return
    try:
        folders = sorted(e.name for e in os.scandir(model_dir) if e.is_dir())
    except OSError:
        return
    if folders and os.path.exists(os.path.join(model_dir, folders[0], DEFAULT_MODEL_FILENAME)):
        config.backend = PYTHON_BACKEND


async def complete_model_config(entry: ModelEntry, config: ModelConfig) -> ModelConfig:
    """`config` as completed by the model's auto_complete_config; `config` itself when the
    model file does not mention the method. INVALID_ARG, naming the model, if it fails."""
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
    filename = config.default_model_filename or DEFAULT_MODEL_FILENAME
    if not _mentions_method(os.path.join(entry.path, str(version), filename)):
        return config
    return await auto_complete(entry.path, version, config)


async def auto_complete(model_dir: str, version: int, config: ModelConfig, *,
                        timeout: float = TIMEOUT_SECONDS) -> ModelConfig:
    """Runs `<model_dir>/<version>`'s auto_complete_config on `config` in a child process,
    which is killed after `timeout` seconds."""
    name = config.name or os.path.basename(model_dir)
    given = config_to_json(config)
    given["name"] = name  # Triton names the model in the config it hands over
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *worker_command("workers.autocomplete", model_dir, str(version)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=worker_env())
    try:
        out, err = await asyncio.wait_for(
            process.communicate(json.dumps(given).encode()), timeout)
    except TimeoutError:
        raise _failed(name, f"auto_complete_config did not return within {timeout:g} s") from None
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
        raise _failed(name, f"auto_complete_config returned a bad configuration: "
                            f"{exc.message}") from None
    log.info("model '%s': auto_complete_config ran in %.2fs", name, time.monotonic() - started)
    return completed


def _mentions_method(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return METHOD_NAME in f.read()
    except OSError:
        return False  # the instances report a missing or unreadable model file


def _failed(name: str, reason: str) -> ServerError:
    return invalid_arg(f"failed to auto-complete the configuration of model '{name}': {reason}")
