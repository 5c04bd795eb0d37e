#!/usr/bin/env bash
# Merlin installer for Debian / Ubuntu / Armbian on aarch64 (RK3588 boards) or x86-64.
# Run from a Merlin source folder: sudo bash packaging/install.sh [options]; --help for more.
set -euo pipefail
umask 022  # what it installs is for every user (a strict umask made /opt/merlin root's alone)

usage() {
  cat <<'EOF'
Usage: sudo bash packaging/install.sh [OPTIONS]

Installs Merlin from this source folder:
  - the system packages Qt needs, fonts-noto-cjk, python3-venv (apt-get)
  - a copy of the source in PREFIX/src and a Python venv in PREFIX/venv with Merlin in it
  - launchers /usr/local/bin/merlin and /usr/local/bin/merlin-cli
  - a desktop entry (merlin.desktop) and the icon
  - the Numba kernel cache for this CPU, compiled now (merlin --warmup, with progress)
Running it again updates the installation in place (it is idempotent).

Options:
  --kiosk[=cage|autostart]  start Merlin full screen at boot, as USER:
                              cage       a systemd unit runs the cage kiosk compositor on tty1
                                         (for a board that boots to a console; default there)
                              autostart  an XDG autostart entry under the existing desktop
                                         (default when a display manager is enabled)
  --no-kiosk                remove the start-at-boot setup (the app stays installed)
  --uninstall               remove everything this script added (chats and caches are kept;
                            add --purge to delete USER's Merlin cache too)
  --purge                   with --uninstall: also delete USER's ~/.cache/merlin
  --user USER               who runs Merlin: whose kernel cache is warmed, who the kiosk runs
                            as (default: $SUDO_USER, else the current user)
  --prefix DIR              where the venv and the source copy go (default: /opt/merlin)
  --weights LIST            weights formats to compile kernels for: f32,q8,q4 or all (default: all)
  --kv LIST                 KV cache formats to compile kernels for: f32,q8 or all (default: all)
  --no-warmup               do not compile the kernels now (the app compiles them on first start)
  --no-apt                  do not install system packages (you installed them yourself)
  --dry-run                 print what would be done, change nothing
  -h, --help                this text

Environment (tests): MERLIN_OS_RELEASE (default /etc/os-release), MERLIN_ARCH (default uname -m).
EOF
}

# ---------------------------------------------------------------------------- arguments

PREFIX=/opt/merlin
TARGET_USER=""
KIOSK=""          # "", cage, autostart, auto, off
UNINSTALL=0
PURGE=0
DRY_RUN=0
WARMUP=1
APT=1
WEIGHTS=all
KV=all

die() { echo "install.sh: error: $*" >&2; exit 2; }
need_value() { [ -n "${2:-}" ] && [ "${2#--}" = "$2" ] || die "$1 needs a value (see --help)"; }

valid_list() {  # valid_list VALUE ALLOWED...: all, or a comma-separated subset
  local value="$1" item ok; shift
  [ "$value" = all ] && return 0
  IFS=, read -r -a items <<<"$value"
  [ ${#items[@]} -gt 0 ] || return 1
  for item in "${items[@]}"; do
    ok=0; for a in "$@"; do [ "$item" = "$a" ] && ok=1; done
    [ $ok -eq 1 ] || return 1
  done
}

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      --kiosk) KIOSK=auto ;;
      --kiosk=cage|--kiosk=autostart) KIOSK="${1#--kiosk=}" ;;
      --kiosk=*) die "unknown kiosk mode '${1#--kiosk=}': use --kiosk=cage or --kiosk=autostart" ;;
      --no-kiosk) KIOSK=off ;;
      --uninstall) UNINSTALL=1 ;;
      --purge) PURGE=1 ;;
      --dry-run) DRY_RUN=1 ;;
      --no-warmup) WARMUP=0 ;;
      --no-apt) APT=0 ;;
      --user) need_value "$@"; TARGET_USER="$2"; shift ;;
      --user=*) TARGET_USER="${1#*=}" ;;
      --prefix) need_value "$@"; PREFIX="$2"; shift ;;
      --prefix=*) PREFIX="${1#*=}" ;;
      --weights) need_value "$@"; WEIGHTS="$2"; shift ;;
      --weights=*) WEIGHTS="${1#*=}" ;;
      --kv) need_value "$@"; KV="$2"; shift ;;
      --kv=*) KV="${1#*=}" ;;
      *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
  done

  [ "$PURGE" -eq 0 ] || [ "$UNINSTALL" -eq 1 ] || die "--purge only goes with --uninstall"
  if [ "$UNINSTALL" -eq 1 ] && [ -n "$KIOSK" ] && [ "$KIOSK" != off ]; then
    die "--uninstall and --kiosk do not go together"
  fi
  case "$PREFIX" in /*) ;; *) die "--prefix must be an absolute path" ;; esac
  PREFIX="$(realpath -m -s -- "$PREFIX")"  # /opt/, //opt and /opt/. are /opt (uninstall removes it)
  case "$PREFIX" in /|/usr|/usr/local|/etc|/home|/opt|/var|/root|/tmp|/srv|/mnt|/media) die "--prefix $PREFIX is too broad" ;; esac
  valid_list "$WEIGHTS" f32 q8 q4 || die "--weights must be f32, q8, q4 (comma-separated) or all"
  valid_list "$KV" f32 q8 || die "--kv must be f32, q8 (comma-separated) or all"
}

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=/usr/local/bin
APPS=/usr/share/applications
ICON=/usr/share/icons/hicolor/scalable/apps/merlin.svg
UNIT=/etc/systemd/system/merlin-kiosk.service
PAM=/etc/pam.d/merlin-kiosk
AUTOSTART=/etc/xdg/autostart/merlin-kiosk.desktop

say() { echo "==> $*"; }
run() {  # a command that changes the system
  if [ "$DRY_RUN" -eq 1 ]; then echo "would run: $*"; else "$@"; fi
}
write_file() {  # write_file PATH MODE < content
  local path="$1" mode="$2" content
  content="$(cat)"
  if [ "$DRY_RUN" -eq 1 ]; then
    echo "would write $path (mode $mode):"
    printf '%s\n' "$content" | sed 's/^/    | /'
    return
  fi
  mkdir -p "$(dirname "$path")"
  printf '%s\n' "$content" >"$path.tmp.$$"
  chmod "$mode" "$path.tmp.$$"
  mv -f "$path.tmp.$$" "$path"
}
remove() {  # remove PATH...: only what exists
  local p
  for p in "$@"; do
    if [ -e "$p" ] || [ -L "$p" ]; then
      if [ "$DRY_RUN" -eq 1 ]; then echo "would remove $p"; else rm -rf -- "$p"; fi
    fi
  done
}
as_user() {  # run a command as TARGET_USER (with their HOME), printing it in a dry run
  if [ "$DRY_RUN" -eq 1 ]; then echo "would run as $TARGET_USER: $*"; return; fi
  if [ "$(id -un)" = "$TARGET_USER" ]; then "$@"; return; fi
  local home
  home="$(getent passwd "$TARGET_USER" | cut -d: -f6)"
  if command -v runuser >/dev/null; then
    runuser -u "$TARGET_USER" -- env HOME="$home" "$@"
  else
    sudo -H -u "$TARGET_USER" "$@"
  fi
}

# ---------------------------------------------------------------------------- the system

OS_RELEASE="${MERLIN_OS_RELEASE:-/etc/os-release}"
ARCH="${MERLIN_ARCH:-$(uname -m)}"

unsupported() {
  echo "install.sh: this system is not supported: $*" >&2
  echo "Merlin's installer supports Debian 12+, Ubuntu 22.04+ and Armbian/Raspberry Pi OS" \
       "(Debian-based) on aarch64 or x86-64. Elsewhere, install by hand: python3 -m venv," \
       "pip install '.[app]', and Qt 6's runtime libraries (see packaging/README.md)." >&2
  exit 3
}

check_system() {
  [ -r "$OS_RELEASE" ] || unsupported "no $OS_RELEASE (not a Linux distribution this script knows)"
  local ID="" ID_LIKE="" PRETTY_NAME="" VERSION_ID=""
  # shellcheck disable=SC1090
  . "$OS_RELEASE"
  OS_NAME="${PRETTY_NAME:-$ID}"
  case " $ID $ID_LIKE " in
    *" debian "*|*" ubuntu "*) ;;
    *) unsupported "$OS_NAME is not Debian or Ubuntu based (apt-get is needed)" ;;
  esac
  local major="${VERSION_ID%%.*}"
  case "$ID" in
    debian|raspbian) [ -z "$major" ] || [ "$major" -ge 12 ] 2>/dev/null \
                       || unsupported "$OS_NAME is too old (Debian 12 bookworm or newer)" ;;
    ubuntu) [ -z "$major" ] || [ "$major" -ge 22 ] 2>/dev/null \
              || unsupported "$OS_NAME is too old (Ubuntu 22.04 or newer)" ;;
  esac
  case "$ARCH" in
    aarch64|arm64|x86_64|amd64) ;;
    *) unsupported "the CPU architecture is $ARCH (aarch64 or x86-64 are supported)" ;;
  esac
}

check_privileges() {
  [ "$DRY_RUN" -eq 1 ] && return
  if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (sudo bash $0 ...): it installs system packages and" \
         "files under $PREFIX, $BIN and /usr/share." >&2
    exit 4
  fi
}

resolve_user() {
  if [ -z "$TARGET_USER" ]; then
    TARGET_USER="${SUDO_USER:-$(id -un)}"
  fi
  if ! getent passwd "$TARGET_USER" >/dev/null; then
    [ "$DRY_RUN" -eq 1 ] || die "no such user '$TARGET_USER' (--user)"
  fi
}

# ---------------------------------------------------------------------------- install

QT_PACKAGES=(libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libdbus-1-3
  libglib2.0-0 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0
  libwayland-client0 libwayland-cursor0 libwayland-egl1 fonts-noto-cjk)
BASE_PACKAGES=(python3 python3-venv python3-pip ca-certificates)
KIOSK_CAGE_PACKAGES=(cage)

install_packages() {
  local pkgs=("${BASE_PACKAGES[@]}" "${QT_PACKAGES[@]}") missing=() p
  [ "$KIOSK" = cage ] && pkgs+=("${KIOSK_CAGE_PACKAGES[@]}")
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then say "system packages: all present"; return; fi
  say "system packages: installing ${missing[*]}"
  run apt-get update -q
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
}

check_python() {
  # the distribution's interpreter, readable by every user (not a pyenv/conda one in a home)
  PYTHON="${MERLIN_PYTHON:-/usr/bin/python3}"
  [ -x "$PYTHON" ] || PYTHON="$(command -v python3 || echo /usr/bin/python3)"
  [ "$DRY_RUN" -eq 1 ] && [ ! -x "$PYTHON" ] && return
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || unsupported "Python $("$PYTHON" -V 2>&1) is too old (3.10 or newer)"
}

pip_constraints() {
  # Versions that differ by machine. PySide6 aarch64 wheels after 6.8.0.2 need a newer glibc
  # than Debian 12's 2.36; pip skips wheels that do not fit by itself, so this only excludes
  # releases known to be broken: PySide6 6.12.0 aborts under Python < 3.12.
  echo "PySide6-Essentials!=6.12.0"
  local glibc
  glibc="$(ldd --version 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+$' || true)"
  case "$ARCH" in
    aarch64|arm64)
      if [ -n "$glibc" ] && [ "$(printf '%s\n2.39\n' "$glibc" | sort -V | head -n1)" != 2.39 ]; then
        echo "PySide6-Essentials<=6.8.0.2"  # the newest aarch64 wheel for glibc < 2.39
      fi ;;
  esac
}

place_source() {  # the new source at $PREFIX/src; the installed one kept as src.old until pip is done
  say "copying the source to $PREFIX/src"
  if [ "$DRY_RUN" -eq 1 ]; then
    echo "would copy $SRC (without .git, .venv, build output) to $PREFIX/src"
    return
  fi
  mkdir -p "$PREFIX"
  rm -rf "$PREFIX/src.new" "$PREFIX/src.old"
  mkdir -p "$PREFIX/src.new"
  tar -C "$SRC" --exclude=.git --exclude=.venv --exclude=venv --exclude=build --exclude=dist \
      --exclude=__pycache__ --exclude='*.egg-info' --exclude=.pytest_cache \
      --exclude=.ruff_cache -cf - . | tar -C "$PREFIX/src.new" -xf -
  if [ -d "$PREFIX/src" ]; then mv "$PREFIX/src" "$PREFIX/src.old"; fi
  mv "$PREFIX/src.new" "$PREFIX/src"
}

restore_source() {  # pip failed: the installed Merlin gets its own source back
  if [ "$DRY_RUN" -eq 0 ] && [ -d "$PREFIX/src.old" ]; then
    rm -rf "$PREFIX/src"
    mv "$PREFIX/src.old" "$PREFIX/src"
  fi
}

pip_install_merlin() {  # CONSTRAINTS: Merlin and its packages into the venv, online or from what it has
  local python="$PREFIX/venv/bin/python" constraints="$1"
  local pip=("$python" -m pip install --disable-pip-version-check --progress-bar off -c "$constraints")
  run "$python" -m pip install -q --disable-pip-version-check --upgrade pip \
    || say "pip was not upgraded (is the package index reachable?): using the venv's own"
  say "installing Merlin and its Python packages (NumPy, Numba, PySide6, ...)"
  # editable: the venv runs the code in $PREFIX/src, where the icons (src/merlin/resources/) live
  # too. setuptools (Merlin's build backend) goes into the venv as well, so that a re-run
  # without the network can build Merlin there (--no-build-isolation) from what is installed
  run "${pip[@]}" -e "$PREFIX/src[app]" "setuptools>=70.1" && return 0
  say "the package index cannot be reached: installing with the packages the venv already has"
  run "${pip[@]}" --no-index --no-build-isolation -e "$PREFIX/src[app]"
}

install_venv() {
  place_source
  say "Python environment in $PREFIX/venv"
  local home make=0 version='import sys; print(sys.version_info[:2])'
  home="$(dirname "$(readlink -f "$PYTHON")")"
  if [ ! -x "$PREFIX/venv/bin/python" ]; then
    make=1
  elif ! grep -qx "home = $home" "$PREFIX/venv/pyvenv.cfg" \
      || [ "$("$PREFIX/venv/bin/python" -c "$version" 2>/dev/null)" != "$("$PYTHON" -c "$version")" ]; then
    # another Python, or the same path upgraded in place (Debian 12 to 13: 3.11 to 3.12)
    say "the venv was made with another Python: making it anew with $PYTHON"
    remove "$PREFIX/venv"
    make=1
  fi
  [ "$make" -eq 0 ] || run "$PYTHON" -m venv "$PREFIX/venv"
  local constraints="$PREFIX/constraints.txt"
  pip_constraints | write_file "$constraints" 644
  if ! pip_install_merlin "$constraints"; then
    restore_source
    if [ "$make" -eq 1 ]; then
      die "Merlin's Python packages could not be installed (pip's message above says why; often" \
          "the network or the package index). Connect to the network and run the installer again."
    fi
    die "this Merlin needs Python packages the venv does not have, and pip could not get them" \
        "(its message above says why; often the network). The installed Merlin is unchanged:" \
        "run the installer again with the network."
  fi
  remove "$PREFIX/src.old"
  # byte-compile now: the users who run Merlin cannot write to $PREFIX/src
  run "$PREFIX/venv/bin/python" -m compileall -q "$PREFIX/src/src/merlin"
  run ln -sfn "$PREFIX/venv/bin/merlin" "$BIN/merlin"
  run ln -sfn "$PREFIX/venv/bin/merlin-cli" "$BIN/merlin-cli"
}

install_desktop() {
  say "desktop entry and icon"
  if [ "$DRY_RUN" -eq 1 ]; then echo "would copy src/merlin/resources/icons/merlin.svg to $ICON"
  else install -D -m 644 "$SRC/src/merlin/resources/icons/merlin.svg" "$ICON"; fi
  write_file "$APPS/merlin.desktop" 644 <<EOF
[Desktop Entry]
Type=Application
Name=Merlin
GenericName=Image chat
Comment=Chat with Qwen3-VL vision-language models on this computer
Exec=$BIN/merlin
Icon=merlin
Terminal=false
Categories=Utility;Education;
Keywords=chat;AI;LLM;vision;Qwen;
StartupWMClass=merlin
EOF
  if command -v update-desktop-database >/dev/null; then run update-desktop-database -q "$APPS" || true; fi
  if command -v gtk-update-icon-cache >/dev/null; then
    run gtk-update-icon-cache -q -t /usr/share/icons/hicolor || true
  fi
}

warm_up() {
  [ "$WARMUP" -eq 1 ] || { say "kernel warm-up skipped (--no-warmup)"; return; }
  say "compiling Merlin's kernels for this CPU as $TARGET_USER (first time: a few minutes)"
  as_user "$PREFIX/venv/bin/merlin" --warmup --weights "$WEIGHTS" --kv "$KV"
}

display_manager_enabled() {
  [ -L /etc/systemd/system/display-manager.service ] \
    || { command -v systemctl >/dev/null && systemctl is-enabled display-manager.service >/dev/null 2>&1; }
}

systemd_running() { [ -d /run/systemd/system ]; }

install_kiosk() {
  [ -n "$KIOSK" ] && [ "$KIOSK" != off ] || return 0
  if [ "$KIOSK" = cage ]; then
    remove "$AUTOSTART"
    say "kiosk: systemd unit merlin-kiosk.service (cage on tty1, as $TARGET_USER)"
    write_file "$PAM" 644 <<'EOF'
# Merlin kiosk (cage): a logind session on tty1 for the kiosk user, without a password.
auth     required pam_unix.so nullok
account  required pam_unix.so
session  required pam_unix.so
session  required pam_systemd.so
EOF
    write_file "$UNIT" 644 <<EOF
# Merlin kiosk: installed by packaging/install.sh --kiosk; removed by --no-kiosk.
[Unit]
Description=Merlin kiosk (cage Wayland compositor on tty1)
After=systemd-user-sessions.service plymouth-quit-wait.service dbus.socket systemd-logind.service
Wants=dbus.socket systemd-logind.service
Conflicts=getty@tty1.service
After=getty@tty1.service
ConditionPathExists=/dev/tty1

[Service]
Type=simple
User=$TARGET_USER
PAMName=merlin-kiosk
TTYPath=/dev/tty1
TTYReset=yes
TTYVHangup=yes
TTYVTDisallocate=yes
StandardInput=tty-fail
StandardOutput=journal
StandardError=journal
UtmpIdentifier=tty1
UtmpMode=user
Environment=QT_QPA_PLATFORM=wayland
ExecStart=/usr/bin/cage -s -- $BIN/merlin --fullscreen
Restart=always
RestartSec=3

[Install]
WantedBy=multi-user.target
EOF
    if command -v systemctl >/dev/null; then
      systemd_running && run systemctl daemon-reload
      run systemctl enable merlin-kiosk.service
    fi
    say "kiosk: Merlin starts full screen on tty1 at the next boot" \
        "(now: systemctl start merlin-kiosk)"
  else
    say "kiosk: XDG autostart entry (full screen when $TARGET_USER logs in to the desktop)"
    remove_kiosk_unit
    write_file "$AUTOSTART" 644 <<EOF
[Desktop Entry]
Type=Application
Name=Merlin (kiosk)
Comment=Start Merlin full screen at login; installed by packaging/install.sh --kiosk
Exec=$BIN/merlin --fullscreen
Icon=merlin
Terminal=false
X-GNOME-Autostart-enabled=true
EOF
    say "kiosk: turn on automatic login for $TARGET_USER in the display manager for a" \
        "board without a keyboard"
  fi
}

remove_kiosk_unit() {
  if [ -e "$UNIT" ]; then
    if command -v systemctl >/dev/null; then run systemctl disable merlin-kiosk.service || true; fi
    remove "$UNIT" "$PAM"
    if command -v systemctl >/dev/null && systemd_running; then run systemctl daemon-reload; fi
  else
    remove "$PAM"
  fi
}

remove_kiosk() {
  say "kiosk: removing the start-at-boot setup"
  remove_kiosk_unit
  remove "$AUTOSTART"
}

uninstall() {
  say "uninstalling Merlin"
  remove_kiosk
  remove "$BIN/merlin" "$BIN/merlin-cli" "$APPS/merlin.desktop" "$ICON"
  if [ -e "$PREFIX/venv/pyvenv.cfg" ] || [ -e "$PREFIX/src/pyproject.toml" ] \
      || [ -z "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
    remove "$PREFIX"
  else
    echo "install.sh: not removing $PREFIX: it does not look like a Merlin installation" >&2
  fi
  if [ "$PURGE" -eq 1 ]; then
    local home
    home="$(getent passwd "$TARGET_USER" | cut -d: -f6 || true)"
    [ -n "$home" ] && remove "$home/.cache/merlin"
  fi
  say "done. Kept: chats, settings and downloaded models (~/.local/share/merlin)$( [ "$PURGE" -eq 1 ] || echo ", caches (~/.cache/merlin)") and the system packages (apt)."
}

# ---------------------------------------------------------------------------- main

main() {
  parse_args "$@"
  [ "$DRY_RUN" -eq 1 ] && say "dry run: nothing is changed"
  check_system
  check_privileges
  resolve_user
  if [ "$UNINSTALL" -eq 1 ]; then uninstall; return 0; fi
  if [ "$KIOSK" = off ] && [ -x "$PREFIX/venv/bin/merlin" ]; then remove_kiosk; return 0; fi
  say "installing Merlin from $SRC on $OS_NAME ($ARCH) for user $TARGET_USER into $PREFIX"
  if [ "$KIOSK" = auto ]; then
    if display_manager_enabled; then KIOSK=autostart; else KIOSK=cage; fi
  fi
  if [ "$KIOSK" = cage ] || [ "$KIOSK" = autostart ]; then
    [ "$TARGET_USER" != root ] || die "the kiosk must not run as root: give --user NAME (an ordinary account)"
  fi
  if [ "$APT" -eq 1 ]; then install_packages; fi
  check_python
  install_venv
  install_desktop
  warm_up
  if [ "$KIOSK" = off ]; then remove_kiosk; else install_kiosk; fi
  say "installed. Start Merlin from the applications menu or with: merlin"
  say "check it at any time with: merlin --self-test"
}

# tests/test_packaging.py sources this file to run its steps one by one
if [ "${BASH_SOURCE[0]:-$0}" = "$0" ]; then main "$@"; fi
