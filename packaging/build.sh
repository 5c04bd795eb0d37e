#!/usr/bin/env bash
# Build the one-folder PyInstaller bundle dist/merlin/ (executables merlin and merlin-cli) and
# check it with `dist/merlin/merlin --self-test`. Builds for the machine it runs on (x86-64 or
# aarch64): PyInstaller does not cross-compile.
#
# Usage: bash packaging/build.sh [--venv DIR] [--no-test]
#   --venv DIR   the build venv (default: ./build/pyi-venv; created with PyInstaller and Merlin's
#                dependencies, kept apart from the development venv)
#   PYTHON=...   the interpreter for a new venv (default python3; needs its shared libpython)
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$SRC/build/pyi-venv"
TEST=1
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) VENV="$2"; shift ;;
    --no-test) TEST=0 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
cd "$SRC"
if [ ! -x "$VENV/bin/pyinstaller" ]; then
  echo "==> build venv $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "pyinstaller>=6.10" -e ".[app]"
fi
echo "==> PyInstaller: packaging/merlin.spec -> dist/merlin/"
"$VENV/bin/pyinstaller" --noconfirm --clean --log-level WARN \
  --distpath "$SRC/dist" --workpath "$SRC/build/pyinstaller" packaging/merlin.spec
du -sh "$SRC/dist/merlin" | sed 's/^/==> bundle size: /'
if [ "$TEST" -eq 1 ]; then
  echo "==> dist/merlin/merlin --self-test"
  "$SRC/dist/merlin/merlin" --self-test
  "$SRC/dist/merlin/merlin-cli" info | grep -E "^(cpu|threads):"
fi
