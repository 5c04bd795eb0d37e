#!/usr/bin/env bash
# Create .venv (if missing) and install Merlin into it with the given extras, e.g. "app,test".
#
# A complete .venv is reused without the network: after a successful install the script writes
# a stamp (the checkout's path, a hash of pyproject.toml, the extras installed); when the stamp
# matches (the extras asked for are among those installed) and Merlin imports, pip is not run, so the quick start works offline and starts at
# once. When pyproject.toml changed and the package index cannot be reached, a .venv that still
# imports Merlin is used as it is, with a warning.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-app}"
stamp=.venv/.merlin-install
here="$(pwd) $(sha256sum pyproject.toml | cut -d' ' -f1)"

modules="merlin.engine"
case ",$extras," in *,app,*|*,test,*) modules="$modules, PySide6.QtWidgets" ;; esac
imports_merlin() {
  .venv/bin/python -c "import $modules" >/dev/null 2>&1
}

installed_covers() {  # the stamp names this checkout and pyproject.toml, and every extra asked for
  [ -f "$stamp" ] && [ "$(head -n 1 "$stamp")" = "$here" ] || return 1
  local have e
  have=",$(sed -n 2p "$stamp"),"
  case "$have" in *,test,*) have="${have}app," ;; esac  # the test extra holds the app's packages
  for e in ${extras//,/ }; do case "$have" in *,"$e",*) ;; *) return 1 ;; esac; done
}

if installed_covers && imports_merlin; then
  exit 0
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "venv: Merlin needs Python 3.10 or newer; python3 here is $(python3 --version 2>&1)." >&2
  exit 1
fi
# a .venv whose interpreter is gone or another Python than python3 is made again (a venv
# made over it keeps its old interpreter)
version='import sys; print(sys.version_info[:2])'
if [ -e .venv ] && [ "$(.venv/bin/python -c "$version" 2>/dev/null)" != "$(python3 -c "$version")" ]; then
  echo "venv: .venv was made by another Python; making it again" >&2
  rm -rf .venv
fi
python3 -m venv .venv 2>/dev/null || python3 -m venv --without-pip .venv
.venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip -q
if .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extras}]"; then
  printf '%s\n%s\n' "$here" "$extras" > "$stamp"
elif imports_merlin; then
  echo "venv: could not update .venv (is the package index reachable?); using it as it is" >&2
elif installed_covers; then  # installed, but something pip cannot fix keeps it from importing
  echo "venv: Merlin is installed in .venv but does not import:" >&2
  .venv/bin/python -c "import $modules" 2>&1 | tail -n 1 >&2
  exit 1
else
  echo "venv: installing Merlin into .venv failed (pip's message above says why: often the" \
    "network or the package index)" >&2
  exit 1
fi
