#!/usr/bin/env bash
# Install what the tests need into .venv (created if missing) and run the whole suite.
#   bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,onnx]'
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
