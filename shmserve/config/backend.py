"""Which backend runs a model: Triton's rules for `backend`, `platform` and the model's files.

Triton's core fills in `backend`, `platform` and `default_model_filename` from whichever of
them a config gives, or from the files of the model's first version folder, before it loads
the backend (AutoCompleteBackendFields); it then checks that backend and platform agree
(ValidateModelConfig). The rules and error texts here are Triton's. Which of those backends
shmserve runs, and what each needs installed, is `BACKENDS`; the front only looks the package
up, and never imports a framework.
"""

import importlib.util
import os
from dataclasses import dataclass

from shmserve.errors import invalid_arg
from shmserve.proto import ModelConfig

ENSEMBLE_PLATFORM = "ensemble"
# A config's `runtime` for a Python-based backend: <backend directory>/<backend>/model.py.
PYTHON_RUNTIME = "model.py"
# tritonserver's default --backend-directory.
DEFAULT_BACKEND_DIRECTORY = "/opt/tritonserver/backends"


@dataclass(frozen=True)
class Backend:
    name: str
    # What it needs: the top-level module of its framework, and the extra of
    # pyproject.toml that installs it (None: nothing beyond shmserve itself).
    package: str | None = None
    extra: str | None = None


# The backends shmserve runs (workers/backends/).
BACKENDS = {
    "python": Backend("python"),
    "onnxruntime": Backend("onnxruntime", package="onnxruntime", extra="onnx"),
    "pytorch": Backend("pytorch", package="torch", extra="torch"),
}


@dataclass(frozen=True)
class _Kind:
    """A backend Triton knows by platform and file name."""
    backend: str
    platforms: tuple  # the first is the one filled in when the config names none
    filename: str
    # How a model file of this kind may appear in a version folder: "file", "dir" or "any".
    form: str


# In the order Triton's core tries them. TensorFlow is known by its platforms alone, and so is
# left out of the file rules; a model of one of these backends that shmserve does not run
# still resolves to it, and is then refused by name.
_KINDS = (
    _Kind("tensorrt", ("tensorrt_plan",), "model.plan", "file"),
    _Kind("onnxruntime", ("onnxruntime_onnx",), "model.onnx", "any"),
    _Kind("openvino", (), "model.xml", "any"),
    _Kind("pytorch", ("pytorch_libtorch", "libtorch"), "model.pt", "file"),
    _Kind("python", (), "model.py", "any"),
)
_TENSORFLOW_PLATFORMS = {"tensorflow_savedmodel": "model.savedmodel",
                         "tensorflow_graphdef": "model.graphdef"}
# Triton's backend types of a backend name and of a platform: a known backend must come with a
# platform of its own type (ValidateModelConfig). Python, and backends Triton does not know,
# take any platform.
_BACKEND_TYPES = {"tensorflow": "tensorflow", "tensorrt": "tensorrt",
                  "onnxruntime": "onnxruntime", "pytorch": "pytorch"}
_PLATFORM_TYPES = {"tensorflow_graphdef": "tensorflow", "tensorflow_savedmodel": "tensorflow",
                   "tensorrt_plan": "tensorrt", "onnxruntime_onnx": "onnxruntime",
                   "pytorch_libtorch": "pytorch", "torch_aoti": "pytorch"}


def fill_backend_fields(config: ModelConfig, model_dir: str, model_name: str) -> None:
    """Fill in `backend`, `platform` and `default_model_filename` as Triton's core does, from
    what the config gives and the first version folder (in name order) of `model_dir`.
    INVALID_ARG, in Triton's words, when nothing names a backend."""
    if not config.name:
        config.name = model_name
    listing = _first_version_listing(model_dir)
    filename = config.default_model_filename
    if not config.platform and config.backend in ("", "tensorflow"):
        platform = next((p for p, f in _TENSORFLOW_PLATFORMS.items() if f == filename), "")
        if not platform and not filename and listing is not None:
            folder, names = listing
            if ("model.savedmodel" in names
                    and os.path.isdir(os.path.join(folder, "model.savedmodel"))):
                platform = "tensorflow_savedmodel"
            if ("model.graphdef" in names
                    and not os.path.isdir(os.path.join(folder, "model.graphdef"))):
                platform = "tensorflow_graphdef"
        config.platform = platform
    if config.platform in _TENSORFLOW_PLATFORMS:
        config.backend = config.backend or "tensorflow"
        config.default_model_filename = filename or _TENSORFLOW_PLATFORMS[config.platform]
        return
    for kind in _KINDS:
        if not config.backend:
            if config.platform in kind.platforms or (filename and filename == kind.filename):
                config.backend = kind.backend
            elif not config.platform and not filename and _holds(listing, kind):
                config.backend = kind.backend
                if kind.backend == "pytorch":
                    config.platform = kind.platforms[0]
        if config.backend == kind.backend:
            if kind.backend == "pytorch":
                # Triton names the file only when it chose the platform too.
                if not config.platform:
                    config.platform = kind.platforms[0]
                    config.default_model_filename = filename or kind.filename
                return
            if not config.platform and kind.platforms:
                config.platform = kind.platforms[0]
            if not filename:
                config.default_model_filename = kind.filename
            return
    if not config.backend and not config.platform and not filename:
        # Triton's custom backends: a model named "<name>.<backend>" runs on <backend>.
        _, dot, backend = model_name.partition(".")
        if not dot:
            raise invalid_arg(f"Invalid model name: Could not determine backend for model "
                              f"'{model_name}' with no backend in model configuration. "
                              "Expected model name of the form 'model.<backend_name>'.")
        config.backend = backend
        config.default_model_filename = f"model.{backend}"


def check_backend_fields(config: ModelConfig) -> None:
    """Triton's checks that `backend` and `platform` agree (INVALID_ARG, Triton's texts)."""
    name = config.name
    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise invalid_arg(f"unexpected platform type '{config.platform}' for {name}")
        return
    if config.platform == ENSEMBLE_PLATFORM:
        raise invalid_arg(f"Ensemble model '{name}' must have platform type "
                          f"'{config.platform}' and empty backend type")
    backend_type = _BACKEND_TYPES.get(config.backend)
    if backend_type is not None and backend_type != _PLATFORM_TYPES.get(config.platform):
        raise invalid_arg("unexpected 'platform' and 'backend' pair, got:"
                          f"{config.platform}, {config.backend}")


def require_backend(config: ModelConfig, backend_directory: str = DEFAULT_BACKEND_DIRECTORY,
                    find_spec=importlib.util.find_spec) -> None:
    """INVALID_ARG when shmserve cannot run the model's backend: one it does not have (in
    Triton's words for a backend library it cannot find), or one whose framework is not
    installed (naming the extra that installs it). An ensemble needs none.

    As Triton's core: a backend shmserve does not have, or any backend with `runtime:
    "model.py"`, is a Python-based backend when `<backend_directory>/<backend>/model.py`
    exists; the config's `runtime` then says "model.py"."""
    if config.platform == ENSEMBLE_PLATFORM and not config.backend:
        return
    runtime = config.runtime
    if runtime == PYTHON_RUNTIME or (not runtime and config.backend not in BACKENDS):
        folder = python_backend_folder(backend_directory, config.backend)
        path = os.path.join(folder or backend_directory, PYTHON_RUNTIME)
        if folder is None:
            raise invalid_arg(f"backend name '{config.backend}' of model '{config.name}' is not "
                              f"the name of a folder in backend directory "
                              f"'{backend_directory}'")
        if not os.path.isfile(path):
            if runtime:
                raise invalid_arg("unable to find Python backend based backend library "
                                  f"'{PYTHON_RUNTIME}' for model '{config.name}', searched: "
                                  f"'{path}'")
            raise invalid_arg(f"unable to find backend library for backend '{config.backend}', "
                              "try specifying runtime on the model configuration.")
        config.runtime = PYTHON_RUNTIME
        return
    if runtime and runtime != f"libtriton_{config.backend}.so":
        raise invalid_arg(f"unable to find backend library '{runtime}' for model "
                          f"'{config.name}': shmserve runs backend '{config.backend}' itself "
                          f"(runtime '', 'libtriton_{config.backend}.so' or "
                          f"'{PYTHON_RUNTIME}' for a Python-based backend)")
    backend = BACKENDS.get(config.backend)
    if backend is None:
        raise invalid_arg(f"unable to find backend library for backend '{config.backend}', "
                          "try specifying runtime on the model configuration.")
    if backend.package is not None and find_spec(backend.package) is None:
        raise invalid_arg(
            f"backend '{backend.name}' of model '{config.name}' needs the Python package "
            f"'{backend.package}', which is not installed: pip install "
            f"'shmserve[{backend.extra}]'")


def python_backend_folder(backend_directory: str, backend: str) -> str | None:
    """The folder of Python-based backend `backend` (its model.py lies there); None for a name
    that is not one folder's name (a path could lead out of `backend_directory`)."""
    if backend in ("", ".", "..") or "/" in backend or "\0" in backend:
        return None
    return os.path.join(os.path.abspath(backend_directory), backend)


def runtime_folder(runtime: str, backend: str, backend_directory: str) -> str:
    """Where the Python-based backend of a model (its config's `runtime` and `backend`, as
    require_backend resolved them) lives; "" for every other model."""
    if runtime != PYTHON_RUNTIME:
        return ""
    return python_backend_folder(backend_directory, backend) or ""


def parse_backend_config(values: list) -> dict:
    """--backend-config values (`<backend>,<setting>=<value>`, or `<setting>=<value>` for
    every backend) as {backend or "": {setting: value}}; ValueError for a malformed one."""
    settings: dict = {}
    for value in values:
        backend, comma, setting = value.partition(",")
        if not comma or "=" in backend:
            backend, setting = "", value
        key, equals, item = setting.partition("=")
        if not equals or not key:
            raise ValueError(f"--backend-config '{value}': expected "
                             "'<backend>,<setting>=<value>' or '<setting>=<value>'")
        settings.setdefault(backend, {})[key] = item
    return settings


# Triton's defaults for every backend's settings.
_DEFAULT_SETTINGS = {"default-max-batch-size": "4"}


def backend_settings(backend_config: dict, backend: str) -> dict:
    """The settings backend `backend` gets: Triton's defaults, then the global ones, then its
    own."""
    return {**_DEFAULT_SETTINGS, **backend_config.get("", {}), **backend_config.get(backend, {})}


def _first_version_listing(model_dir: str):
    """(path, names in it) of the first subfolder of `model_dir` in name order (Triton
    inspects that one alone), or None when there is none."""
    try:
        folders = sorted(e.name for e in os.scandir(model_dir) if e.is_dir())
    except OSError:
        return None
    if not folders:
        return None
    folder = os.path.join(model_dir, folders[0])
    try:
        return folder, set(os.listdir(folder))
    except OSError:
        return folder, set()


def _holds(listing, kind: _Kind) -> bool:
    if listing is None:
        return False
    folder, names = listing
    if kind.filename not in names:
        return False
    if kind.form == "any":
        return True
    is_dir = os.path.isdir(os.path.join(folder, kind.filename))
    return is_dir if kind.form == "dir" else not is_dir


# Characters Triton's Python backend refuses in the name of a process it starts (a shell
# would read them).
_STUB_NAME_REFUSES = frozenset(";|&$`<>()[]{}\\\"'*?~#!")


def check_stub_names(config, auto_complete: bool) -> None:
    """Triton's Python backend names its processes after the model (the auto-complete one)
    and its instances, and refuses names a shell would read: INVALID_ARG, its text."""
    names = [config.name] if auto_complete else []
    names += [group.name for group in config.instance_group]
    if any(_STUB_NAME_REFUSES.intersection(name) for name in names):
        raise invalid_arg("Invalid stub name: contains invalid characters")
