"""`python -m workers.autocomplete <model_dir> <version>`: runs a model's auto_complete_config.

Reads the model's config as JSON on stdin, imports the model as the runner does, and writes
the config that `TritonPythonModel.auto_complete_config(pb_utils.ModelConfig)` returns as JSON
on stdout (the input unchanged when the class has no such method). On failure it exits with 1
and the reason as the last line of stderr. A process of its own, as Triton's throwaway stub:
whatever the model imports or sets up here is gone before its instances start.
"""

import json
import os
import sys

from workers import triton_python_backend_utils as pb_utils
from workers.runner import import_model


class AutoCompleteError(Exception):
    pass


def complete(model_dir: str, version: str, config_json: str) -> str:
    """The config JSON after the model's auto_complete_config; AutoCompleteError if it fails."""
    try:
        given = pb_utils.ModelConfig(config_json)
    except ValueError as exc:
        raise AutoCompleteError(f"the model configuration is not JSON: {exc}") from exc
    config = given.as_dict()
    filename = config.get("default_model_filename") or "model.py"
    path = os.path.join(model_dir, version, filename)
    try:
        module = import_model(model_dir, version, os.path.splitext(filename)[0])
    except Exception as exc:
        raise AutoCompleteError(f"failed to import '{path}': {_describe(exc)}") from exc
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise AutoCompleteError(f"'{path}' does not define class TritonPythonModel")
    method = getattr(model_class, "auto_complete_config", None)
    if method is None:
        return config_json
    try:
        completed = method(given)
    except Exception as exc:
        raise AutoCompleteError(f"auto_complete_config raised {_describe(exc)}") from exc
    if not isinstance(completed, pb_utils.ModelConfig):
        raise AutoCompleteError("auto_complete_config must return the pb_utils.ModelConfig it "
                                f"was given, not {type(completed).__name__}")
    try:
        return json.dumps(completed.as_dict())
    except (TypeError, ValueError) as exc:
        raise AutoCompleteError(
            f"auto_complete_config made a config that is not JSON: {exc}") from exc


def main(argv: list) -> int:
    model_dir, version = argv[1], argv[2]
    # Whatever the model prints goes to stderr: stdout carries the config alone.
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        result = complete(model_dir, version, sys.stdin.read())
    except AutoCompleteError as exc:
        sys.stderr.write(" ".join(str(exc).splitlines()) + "\n")
        return 1
    result_out.write(result)
    result_out.close()
    return 0


def _describe(exc: BaseException) -> str:
    # One line, unlike runner._describe's frames: the server reads this script's stderr as
    # one message.
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
