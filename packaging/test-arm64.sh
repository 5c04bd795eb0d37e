#!/usr/bin/env bash
# The aarch64 check, runnable on an x86-64 Debian/Ubuntu host as root (slow: 30-90 minutes):
#   1. builds (once) a Debian bookworm arm64 root with debootstrap, run through qemu-user
#      emulation (qemu-user-static + binfmt_misc);
#   2. runs packaging/install.sh inside it (system packages, venv, pip, kernel warm-up);
#   3. runs `merlin --self-test` there (demo checkpoint, an image question, the window
#      rendered offscreen);
#   4. runs the kernels' contract (tests/engine/kernels/class_check.py) for arm64-neon and
#      arm64-dotprod (the A76's features) and compares the two classes' outputs bit for bit;
#   5. prints the aarch64 assembly of the hot kernels (qlinear matmul_q8, qgroup matmul_q4g,
#      attention) and counts their NEON instructions (fmla v.4s, sdot, ...).
# Not part of the test suite. Its last result is recorded in packaging/README.md.
#
# Usage: sudo bash packaging/test-arm64.sh [--root DIR] [--fresh] [--weights LIST] [--kv LIST]
#   --root DIR      the arm64 root (default /var/tmp/merlin-arm64/root; reused between runs)
#   --fresh         delete the root first and build it anew
#   --weights/--kv  formats install.sh warms up (default all / all, as install.sh: about 15
#                   minutes emulated; f32 / f32 takes 2)
#   --skip-install  reuse the installation already in the root (self-test and asm only)
# Logs: /var/tmp/merlin-arm64/logs/.
set -euo pipefail

ROOT=/var/tmp/merlin-arm64/root
FRESH=0
WEIGHTS=all
KV=all
SKIP_INSTALL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT="$2"; shift ;;
    --fresh) FRESH=1 ;;
    --weights) WEIGHTS="$2"; shift ;;
    --kv) KV="$2"; shift ;;
    --skip-install) SKIP_INSTALL=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "test-arm64.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="$(dirname "$ROOT")/logs"
mkdir -p "$LOGS"
START=$(date +%s)
step() { echo; echo "=== [$(date -u +%H:%M:%S), +$(( $(date +%s) - START )) s] $*"; }

[ "$(id -u)" -eq 0 ] || { echo "test-arm64.sh: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
case "$(uname -m)" in
  x86_64) ;;
  aarch64) echo "test-arm64.sh: this is an aarch64 machine: run packaging/install.sh directly" >&2; exit 2 ;;
  *) echo "test-arm64.sh: needs an x86-64 host" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------------------- host tools
step "host: debootstrap, qemu-user-static, binfmt"
missing=()
for p in debootstrap qemu-user-static binfmt-support; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  update-binfmts --enable qemu-aarch64 || true
fi
grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 \
  || { echo "test-arm64.sh: qemu-aarch64 is not registered in binfmt_misc" >&2; exit 1; }

# ---------------------------------------------------------------------------- the root
if [ "$FRESH" -eq 1 ]; then
  for m in dev/pts dev proc sys; do umount "$ROOT/$m" 2>/dev/null || true; done
  rm -rf "$ROOT"
fi
if [ ! -e "$ROOT/etc/debian_version" ] || [ ! -x "$ROOT/usr/bin/apt-get" ]; then
  step "debootstrap: Debian bookworm arm64 into $ROOT (emulated; 10-30 minutes)"
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  debootstrap --arch=arm64 --variant=minbase --include=ca-certificates,sudo bookworm "$ROOT" \
    http://deb.debian.org/debian >"$LOGS/debootstrap.log" 2>&1 \
    || { tail -20 "$LOGS/debootstrap.log"; exit 1; }
fi
echo "root: $(cat "$ROOT/etc/debian_version"), $(chroot "$ROOT" uname -m)"

mounted=()
cleanup() {
  local i
  for (( i=${#mounted[@]}-1; i>=0; i-- )); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mkdir -p "$ROOT/$m"
  if ! mountpoint -q "$ROOT/$m"; then
    case "$m" in
      proc) mount -t proc proc "$ROOT/proc" ;;
      sys) mount --rbind /sys "$ROOT/sys" ;;
      dev) mount --bind /dev "$ROOT/dev" ;;
      dev/pts) mount --bind /dev/pts "$ROOT/dev/pts" ;;
    esac
    mounted+=("$ROOT/$m")
  fi
done
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
# this machine's CA bundle (pip inside the root must trust what the host trusts)
cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca-bundle.crt"
# no service starts inside the chroot
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"

in_root() {  # a command in the arm64 root, with a clean environment
  chroot "$ROOT" /usr/bin/env -i HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DEFAULT_TIMEOUT=180 \
    "$@"
}

# ---------------------------------------------------------------------------- install.sh
rm -rf "$ROOT/root/merlin-src"
mkdir -p "$ROOT/root/merlin-src"
tar -C "$SRC" --exclude=.git --exclude=.venv --exclude=build --exclude=dist \
  --exclude=__pycache__ --exclude='*.egg-info' --exclude=.pytest_cache --exclude=.ruff_cache \
  -cf - . | tar -C "$ROOT/root/merlin-src" -xf -

result_install="skipped"
if [ "$SKIP_INSTALL" -eq 0 ]; then
  step "install.sh --dry-run inside the root"
  in_root bash /root/merlin-src/packaging/install.sh --dry-run --weights "$WEIGHTS" --kv "$KV" \
    | tail -5
  step "install.sh inside the root (apt, venv, pip, warm-up of weights $WEIGHTS / KV $KV)"
  t0=$(date +%s)
  if in_root bash /root/merlin-src/packaging/install.sh --weights "$WEIGHTS" --kv "$KV" \
      2>&1 | tee "$LOGS/install.log"; then
    result_install="passed in $(( $(date +%s) - t0 )) s"
  else
    result_install="FAILED (see $LOGS/install.log)"
    echo "install.sh failed" >&2
  fi
  step "install.sh again (idempotent: no changes, quick)"
  t0=$(date +%s)
  if in_root bash /root/merlin-src/packaging/install.sh --no-apt --weights "$WEIGHTS" --kv "$KV" \
      >"$LOGS/install-again.log" 2>&1; then
    result_install="$result_install; again: passed in $(( $(date +%s) - t0 )) s"
  else
    result_install="$result_install; again: FAILED (see $LOGS/install-again.log)"
  fi
fi
in_root /opt/merlin/venv/bin/python -c \
  'import sys, numpy, numba, llvmlite, PySide6; print("python", sys.version.split()[0], "numpy", numpy.__version__, "numba", numba.__version__, "llvmlite", llvmlite.__version__, "PySide6", PySide6.__version__)' \
  2>&1 | tee "$LOGS/versions.txt" || true

# ---------------------------------------------------------------------------- self-test
step "merlin --self-test inside the root"
t0=$(date +%s)
if in_root /usr/local/bin/merlin --self-test 2>&1 | tee "$LOGS/self-test.log"; then
  result_self_test="passed in $(( $(date +%s) - t0 )) s"
else
  result_self_test="FAILED (see $LOGS/self-test.log)"
fi
in_root /usr/local/bin/merlin-cli info 2>&1 | grep -E "^(cpu|threads):" || true

# the Armv8.2-A features of the RK3588's Cortex-A76 cores (what LLVM detects on the board)
A76_FEATURES="+neon,+fp-armv8,+crc,+lse,+rdm,+rcpc,+dotprod,+fullfp16,+ssbs"

# ---------------------------------------------------------------------------- kernel contract
step "kernel contract per aarch64 class (tests/engine/kernels/class_check.py)"
# each class's grouped q4/q8/q8a8, row-major q8 and attention kernels: rows of N-row calls
# bitwise equal to 1-row calls (N = 1..9, 1 and 2 threads), the NumPy twins, the int16 bounds;
# arm64-neon as the emulated CPU reports itself, arm64-dotprod as the A76 (its features); then
# the two classes' outputs compared bit for bit (one group size, exact integer dots)
result_kernels=""
in_root /opt/merlin/venv/bin/python -m pip install -q pytest >"$LOGS/pytest-install.log" 2>&1 \
  || result_kernels="pytest install FAILED (see $LOGS/pytest-install.log); "
for cls in arm64-neon arm64-dotprod; do
  env_cls=(NUMBA_CACHE_DIR="/tmp/merlin-check-$cls")
  [ "$cls" = arm64-neon ] || env_cls+=(NUMBA_CPU_NAME=cortex-a76 NUMBA_CPU_FEATURES="$A76_FEATURES")
  t0=$(date +%s)
  if in_root "${env_cls[@]}" /opt/merlin/venv/bin/python \
      /root/merlin-src/tests/engine/kernels/class_check.py "$cls" "/root/check-$cls.npz" \
      >"$LOGS/check-$cls.log" 2>&1 && grep -q "class ok" "$LOGS/check-$cls.log"; then
    result_kernels="$result_kernels$cls ok ($(( $(date +%s) - t0 )) s); "
  else
    result_kernels="$result_kernels$cls FAILED (see $LOGS/check-$cls.log); "
  fi
done
if in_root /opt/merlin/venv/bin/python -c '
import sys, numpy as np
a, b = (np.load(f"/root/check-{c}.npz") for c in ("arm64-neon", "arm64-dotprod"))
keys = [k for k in ("q4", "q8", "q8a8", "q4-ext", "q8-ext", "q8a8-ext") if k in a.files]
bad = [k for k in keys if not np.array_equal(a[k], b[k])]
print("different:", bad) if bad else print("same bits:", " ".join(keys))
sys.exit(1 if bad or not keys else 0)' >"$LOGS/check-compare.log" 2>&1; then
  result_kernels="${result_kernels}same bits"
else
  result_kernels="${result_kernels}outputs DIFFER or missing (see $LOGS/check-compare.log)"
fi
echo "kernels: $result_kernels"

# ---------------------------------------------------------------------------- assembly
step "aarch64 assembly of the hot kernels"
asm_summary=""
for cpu in host cortex-a76; do
  echo "--- target CPU: $cpu"
  env_cpu=(NUMBA_CACHE_DIR="/tmp/merlin-asm-$cpu" MERLIN_WEIGHT_CACHE="/tmp/merlin-asm-$cpu/weights")
  # a named CPU needs its features too: without NUMBA_CPU_FEATURES Numba (and Merlin's choice
  # of dot instruction) take the emulated host's, which lack the dot-product extension
  [ "$cpu" = host ] || env_cpu+=(NUMBA_CPU_NAME="$cpu" NUMBA_CPU_FEATURES="$A76_FEATURES")
  rm -rf "$ROOT/tmp/merlin-asm-$cpu" "$ROOT/root/asm-$cpu"
  # a fresh Numba cache: Numba shows no assembly for kernels loaded from its disk cache
  if in_root "${env_cpu[@]}" /opt/merlin/venv/bin/python \
      /opt/merlin/src/packaging/inspect_asm.py "/root/asm-$cpu" 2>&1 | tee "$LOGS/asm-$cpu.txt"; then
    asm_summary="$asm_summary $cpu: ok"
  else
    asm_summary="$asm_summary $cpu: FAILED"
  fi
  rm -rf "$LOGS/asm-$cpu" && cp -r "$ROOT/root/asm-$cpu" "$LOGS/asm-$cpu"
done

step "summary ($(date -u +%Y-%m-%d))"
echo "host:       $(uname -m), $(. /etc/os-release; echo "$PRETTY_NAME"), qemu $(qemu-aarch64-static --version | head -n1 | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1)"
echo "root:       Debian $(cat "$ROOT/etc/debian_version") arm64, glibc $(in_root ldd --version | head -n1 | grep -oE '[0-9.]+$')"
echo "versions:   $(cat "$LOGS/versions.txt" 2>/dev/null | tail -n1)"
echo "install.sh: $result_install"
echo "self-test:  $result_self_test"
echo "kernels:    $result_kernels"
echo "asm:       $asm_summary (files in $LOGS/asm-*)"
echo "total:      $(( $(date +%s) - START )) s"
case "$result_install$result_self_test$result_kernels" in *FAILED*|*DIFFER*) exit 1 ;; esac
