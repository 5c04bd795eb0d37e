#!/usr/bin/env bash
# The tests against llama.cpp's own OpenAI-compatible server (pytest marker `peer`): builds
# llama.cpp from PyPI into its own venv under the user cache (once, 5-10 minutes on 2 cores;
# engine/bench/peer.py) if it is missing, then runs them offscreen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh test
export QT_QPA_PLATFORM=offscreen
.venv/bin/python -c "from merlin.engine.bench import peer; print('llama-cpp-python', peer.ensure_llama_cpp())"
.venv/bin/python -m pytest -q -m peer "$@"
