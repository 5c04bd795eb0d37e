"""Saving over a file the user named keeps its symlink and its permissions (replace_file.py),
for the array files of sessions and KV caches and for chat exports."""

import os
import stat

import numpy as np
import pytest

from merlin.app.model.chat_export import write_atomically
from merlin.engine import arrayfile


def save_array(path, value):
    arrayfile.write(path, "test", {"v": value}, [arrayfile.array_spec("a", np.arange(4) + value)])


def read_value(path):
    with arrayfile.Reader(path, "test") as r:
        return r.meta["v"]


def save_bytes(path, value):
    write_atomically(path, str(value).encode())


def read_bytes(path):
    return int(path.read_bytes())


SAVERS = {"array file": (save_array, read_value), "chat export": (save_bytes, read_bytes)}


@pytest.mark.parametrize("kind", list(SAVERS))
def test_a_private_file_stays_private(tmp_path, kind):
    save, read = SAVERS[kind]
    path = tmp_path / "chat"
    save(path, 1)
    os.chmod(path, 0o600)
    save(path, 2)
    assert read(path) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o640)
    save(path, 3)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


@pytest.mark.parametrize("kind", list(SAVERS))
def test_a_symlink_stays_a_link_and_its_target_gets_the_save(tmp_path, kind):
    save, read = SAVERS[kind]
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "chat"
    save(real, 1)
    link = tmp_path / "link"
    link.symlink_to(real)
    save(link, 2)
    assert link.is_symlink() and read(real) == 2 and read(link) == 2
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["chat"]  # no temporary left
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "real" / "new")
    save(dangling, 3)
    assert dangling.is_symlink() and read(tmp_path / "real" / "new") == 3


def test_the_temporary_is_private_before_anything_is_written(tmp_path):
    from merlin.engine import replace_file

    private = tmp_path / "chat"
    private.write_bytes(b"secret")
    os.chmod(private, 0o600)
    replace_file.create_temporary(tmp_path / ".chat.tmp", private)
    assert stat.S_IMODE((tmp_path / ".chat.tmp").stat().st_mode) & 0o077 == 0
    planted = tmp_path / ".other.tmp"
    planted.symlink_to(tmp_path / "victim")
    replace_file.create_temporary(planted, tmp_path / "new")
    assert not (tmp_path / "victim").exists() and not planted.is_symlink()


@pytest.mark.parametrize("kind", list(SAVERS))
def test_links_that_lead_nowhere_and_unkeepable_permissions_still_save(tmp_path, kind, monkeypatch):
    save, read = SAVERS[kind]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    save(loop, 1)
    assert not loop.is_symlink() and read(loop) == 1
    nowhere = tmp_path / "nowhere"
    nowhere.symlink_to(tmp_path / "gone" / "chat")
    save(nowhere, 2)
    assert read(nowhere) == 2
    monkeypatch.setattr(os, "chmod", lambda *a, **k: (_ for _ in ()).throw(PermissionError()))
    save(loop, 3)  # a file system that keeps no permission bits
    assert read(loop) == 3
