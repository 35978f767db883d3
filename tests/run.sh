#!/usr/bin/env bash
# Install what the tests need into .venv (created if missing), run ruff and mypy, then the
# whole suite.
#   bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch: a CPU-only build (the default wheels of other indexes pull GBs of CUDA libraries);
# TORCH_SPEC overrides it, e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu".
.venv/bin/python -m pip install -q -e '.[test,onnx,torch]' ${TORCH_SPEC:-torch==2.13.0}
# Lint and type checks first (configured in pyproject.toml): either failing fails the run.
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
