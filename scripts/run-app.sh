#!/usr/bin/env bash
# Set up (system libraries, .venv) and start the app; extra arguments go to `merlin`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh
bash scripts/venv.sh app
exec .venv/bin/merlin "$@"
