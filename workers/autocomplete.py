"""`python -m workers.autocomplete <model_dir> <version> [<settings JSON> [<runtime dir>]]`:
completes a model's config as its backend does (workers/backends: `auto_complete`).

Reads the model's config as JSON on stdin (its `backend` field names the backend) and writes
the completed config as JSON on stdout; <settings JSON> holds the --backend-config settings
that apply to that backend, <runtime dir> the folder of its Python-based backend. On failure it exits with 1 and the reason as the last line of
stderr. A process of its own, as Triton's throwaway stub: whatever the model or its framework
imports or sets up here is gone before its instances start.
"""

import json
import os
import sys

from workers import backends


def complete(model_dir: str, version: str, config_json: str, settings: dict,
             runtime_dir: str = "") -> str:
    """The config JSON after the backend's auto-complete; BackendError if it fails."""
    try:
        config = json.loads(config_json)
    except ValueError as exc:
        raise backends.BackendError(f"the model configuration is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise backends.BackendError("the model configuration is not a JSON object")
    completed = backends.auto_complete(
        backends.AutoCompleteContext(model_dir, version, config, settings, runtime_dir))
    try:
        return json.dumps(completed)
    except (TypeError, ValueError) as exc:
        raise backends.BackendError(
            f"auto-complete made a config that is not JSON: {exc}") from exc


def main(argv: list) -> int:
    model_dir, version = argv[1], argv[2]
    settings = json.loads(argv[3]) if len(argv) > 3 else {}
    runtime_dir = argv[4] if len(argv) > 4 else ""
    # Whatever the model prints goes to stderr: stdout carries the config alone.
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        result = complete(model_dir, version, sys.stdin.read(), settings, runtime_dir)
    except backends.BackendError as exc:
        # One line: the server reads this script's stderr as one message.
        sys.stderr.write(" ".join(str(exc).splitlines()) + "\n")
        return 1
    result_out.write(result)
    result_out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
