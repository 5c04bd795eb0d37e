#!/usr/bin/env bash
# Set up (system libraries, .venv with the test extras) and run the whole test suite:
# lint, format check, import contracts (pyproject.toml [tool.importlinter]), pytest (GUI tests
# offscreen).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh test
bash scripts/venv.sh test
export QT_QPA_PLATFORM=offscreen
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/python -m pytest -q "$@"
