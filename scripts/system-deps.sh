#!/usr/bin/env bash
# Debian/Ubuntu packages Qt (PySide6) needs to start, offscreen or on a screen, and the CJK
# font for Chinese text; with the argument "test" also llvm-mca (for the benchmark's board
# section and its test). Installs only what is missing; needs root (or sudo) for that,
# and nothing (no network either) when all are there.
set -euo pipefail
pkgs=(libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libdbus-1-3 libglib2.0-0
      libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0 fonts-noto-cjk)
# llvm-19 where the package index has it: LLVM 14-16's llvm-mca has no Neoverse N1 (the
# Cortex-A76's core) tables and uses the Cortex-A57's (src/merlin/engine/bench/mca.py)
if [ "${1:-}" = test ]; then
  if apt-cache show llvm-19 >/dev/null 2>&1; then pkgs+=(llvm-19); else pkgs+=(llvm); fi
fi
command -v dpkg-query >/dev/null || { echo "system-deps: not a Debian-like system; install Qt 6's runtime libraries yourself." >&2; exit 0; }
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "system-deps: installing ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
  echo "system-deps: run as root: apt-get install ${missing[*]}" >&2; exit 1; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
