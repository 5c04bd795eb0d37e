"""The guard of tests/conftest.py: the run uses temporary folders, and writes into the real
folders are caught (tests/user_folders.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from user_folders import Guard


def test_run_uses_temporary_folders():
    from platformdirs import user_cache_path, user_data_path

    for var in ("HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "MERLIN_DATA_DIR"):
        assert "merlin-test-home-" in os.environ[var], var
    assert "merlin-test-home-" in str(user_data_path("merlin"))
    assert "merlin-test-home-" in str(user_cache_path("merlin"))


def test_guard_catches_writes_not_reads(tmp_path):
    real = tmp_path / "real"
    (real / "numba").mkdir(parents=True)
    (real / "old.txt").write_text("x")
    guard = Guard([real], [real / "numba"])
    sys.addaudithook(guard.hook)  # stays installed; harmless outside tmp_path/real
    (real / "old.txt").read_text()
    (real / "numba" / "k.bin").write_bytes(b"k")
    assert guard.changes() == []
    (real / "settings.ini").write_text("max_new_tokens=12")
    os.replace(real / "old.txt", real / "new.txt")
    import sqlite3

    sqlite3.connect(real / "db.sqlite3").close()
    changes = guard.changes()
    assert any("settings.ini" in c for c in changes)
    assert any("new.txt" in c for c in changes) and any("db.sqlite3" in c for c in changes)
    assert not guard.inside(Path(tmp_path) / "elsewhere")
