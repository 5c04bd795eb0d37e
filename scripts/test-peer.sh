#!/usr/bin/env bash
# The tests against llama.cpp (pytest marker `peer`: its OpenAI-compatible server, the qwen3moe
# conversion check and side by side of bench moe): builds
# llama.cpp from PyPI into its own venv under the user cache (once, 5-10 minutes on 2 cores;
# engine/bench/peer.py) if it is missing, then runs them offscreen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh test
export QT_QPA_PLATFORM=offscreen
# built (or found) here, with the real cache folder; the tests then get its path, since they
# run with HOME and the XDG folders pointed at temporary ones (tests/user_folders.py)
MERLIN_PEER_DIR="$(.venv/bin/python -c "from merlin.engine.bench import peer; print(peer.peer_dir())")"
export MERLIN_PEER_DIR
.venv/bin/python -c "from merlin.engine.bench import peer; print('llama-cpp-python', peer.ensure_llama_cpp())"
.venv/bin/python -m pytest -q -m peer "$@"
