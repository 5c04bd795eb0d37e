"""scripts/venv.sh, the quick start's setup step: a complete .venv is reused without running
pip (so `scripts/run-app.sh` starts offline and at once), a changed pyproject.toml reinstalls,
and an install that fails (no network) keeps a working .venv with a warning.

The script runs on a copy of itself beside a copy of pyproject.toml, with a fake `python3` on
PATH and a fake .venv/bin/python that records every pip call, so no real venv is made."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
# -c CODE: imports succeed unless FAKE_IMPORT_FAILS is set; -m pip: logged; install fails when
# FAKE_PIP_OFFLINE is set.
case "$1" in
  -c) if [ -n "${FAKE_IMPORT_FAILS:-}" ]; then
        echo "ImportError: $FAKE_IMPORT_FAILS" >&2; exit 1
      fi ;;
  -m) echo "$*" >> "$FAKE_LOG"
      if [ "$2" = pip ] && [ "$3" = install ] && [ -n "${FAKE_PIP_OFFLINE:-}" ]; then exit 1; fi ;;
esac
"""


FAKE_PYTHON3 = """#!/usr/bin/env bash
# the system's python3: FAKE_PYTHON3_OLD makes it a 3.9
case "$*" in
  *"< (3, 10)"*) [ -z "${FAKE_PYTHON3_OLD:-}" ] ;;
  --version) echo "Python ${FAKE_PYTHON3_OLD:-3.11.2}" ;;
esac
"""


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "venv.sh", tmp_path / "scripts" / "venv.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for folder in (bin_dir, tmp_path / "fakebin"):
        folder.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "fakebin" / "python3").write_text(FAKE_PYTHON3)
    (tmp_path / "fakebin" / "python3").chmod(0o755)
    return tmp_path


def run(checkout: Path, extras: str, **env_extra) -> tuple[subprocess.CompletedProcess, list]:
    log = checkout / "pip.log"
    log.unlink(missing_ok=True)
    env = dict(os.environ, FAKE_LOG=str(log), **env_extra)
    env["PATH"] = f"{checkout / 'fakebin'}:{env['PATH']}"
    r = subprocess.run(
        ["bash", str(checkout / "scripts" / "venv.sh"), extras],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return r, [c for c in calls if " install " in f" {c} "]


def test_complete_venv_is_reused_without_pip(checkout):
    r, installs = run(checkout, "test")
    assert r.returncode == 0, r.stderr
    assert len(installs) == 1  # the first run installs and writes the stamp
    for extras in ("test", "app"):  # the test extra holds the app's packages
        r, installs = run(checkout, extras, FAKE_PIP_OFFLINE="1")
        assert r.returncode == 0, r.stderr
        assert installs == [], f"pip ran for {extras} on a complete .venv"


def test_changed_pyproject_reinstalls(checkout):
    run(checkout, "app")
    with open(checkout / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    r, installs = run(checkout, "app")
    assert r.returncode == 0 and len(installs) == 1


def test_offline_update_keeps_a_working_venv(checkout):
    run(checkout, "app")
    with open(checkout / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    r, installs = run(checkout, "app", FAKE_PIP_OFFLINE="1")
    assert r.returncode == 0
    assert len(installs) == 1 and "using it as it is" in r.stderr


def test_offline_without_a_working_venv_fails_clearly(checkout):
    r, _ = run(checkout, "app", FAKE_PIP_OFFLINE="1", FAKE_IMPORT_FAILS="1")
    assert r.returncode != 0
    assert "the network or the package index" in r.stderr


def test_installed_but_not_importing_says_why_not_the_network(checkout):
    """A library pip cannot install (Qt's, removed) made every start run pip, and offline
    the message blamed the network."""
    run(checkout, "app")
    r, _ = run(checkout, "app", FAKE_PIP_OFFLINE="1", FAKE_IMPORT_FAILS="libxkbcommon.so.0")
    assert r.returncode != 0
    assert "does not import" in r.stderr and "libxkbcommon.so.0" in r.stderr
    assert "network" not in r.stderr


def test_a_python_older_than_3_10_is_named(checkout):
    (checkout / ".venv").rename(checkout / "old-venv")  # a first setup
    r, installs = run(checkout, "app", FAKE_PYTHON3_OLD="3.9.18")
    assert r.returncode != 0 and installs == []
    assert "needs Python 3.10 or newer" in r.stderr and "3.9.18" in r.stderr
