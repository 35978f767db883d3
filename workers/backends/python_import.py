"""How the Python backend imports a model's code, as Triton's Python backend (its stub)
imports it, with our pb_utils as `triton_python_backend_utils`: a model's `<version>/<stem>.py`
as module `<version>.<stem>`, and a Python-based backend's model.py as module `model`.
"""

import importlib.machinery
import importlib.util
import os
import sys

from workers import triton_python_backend_utils as pb_utils


def import_model(model_dir: str, version: str, stem: str, instance_name: str = ""):
    """The module `<model_dir>/<version>/<stem>.py`, imported as Triton's Python backend
    imports it: our pb_utils as `triton_python_backend_utils`, the version folder and the
    model folder on sys.path."""
    version_dir = os.path.join(model_dir, version)
    pb_utils._set_model_context(model_dir=version_dir, instance_name=instance_name)
    sys.modules["triton_python_backend_utils"] = pb_utils
    for entry in (version_dir, model_dir):
        if entry not in sys.path:
            sys.path.append(entry)
    return _import_model_module(version_dir, version, stem)


def import_backend_model(runtime_dir: str, model_dir: str, version: str,
                         instance_name: str = ""):
    """The model.py of a Python-based backend, imported as Triton's stub imports it: as module
    `model`, its folder on sys.path; pb_utils.get_model_dir() is still the model's version
    folder."""
    pb_utils._set_model_context(model_dir=os.path.join(model_dir, version),
                                instance_name=instance_name)
    sys.modules["triton_python_backend_utils"] = pb_utils
    if runtime_dir not in sys.path:
        sys.path.append(runtime_dir)
    sys.modules.pop("model", None)
    __import__("model")
    return sys.modules["model"]


def _import_model_module(version_dir: str, version: str, stem: str):
    # Triton imports "<version>.<stem>" with the model folder on sys.path, which makes the
    # version folder a namespace package (model.py may use relative imports). Registering the
    # package ourselves pins it to this model's folder whatever else sys.path holds, and a fresh
    # package per load keeps an earlier model loaded in this process from shadowing this one.
    for name in [n for n in sys.modules if n == version or n.startswith(version + ".")]:
        del sys.modules[name]
    spec = importlib.machinery.ModuleSpec(version, None, is_package=True)
    spec.submodule_search_locations = [version_dir]
    sys.modules[version] = importlib.util.module_from_spec(spec)
    # The import statement's way in, not importlib.import_module: the interpreter then trims
    # its own frames off a failed import's traceback, as in Triton's stub.
    __import__(f"{version}.{stem}")
    return sys.modules[f"{version}.{stem}"]
