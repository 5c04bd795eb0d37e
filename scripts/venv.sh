#!/usr/bin/env bash
# Create .venv (if missing) and install Merlin into it with the given extras, e.g. "app,test".
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-app}"
python3 -m venv .venv 2>/dev/null || python3 -m venv --without-pip .venv
.venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip -q
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extras}]"
