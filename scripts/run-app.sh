#!/usr/bin/env bash
# Set up (system libraries, .venv) and start the app; extra arguments go to `merlin`, read
# from the folder this was started in (a relative --model path is the caller's).
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
(cd "$checkout" && bash scripts/system-deps.sh && bash scripts/venv.sh app)
exec "$checkout/.venv/bin/merlin" "$@"
