"""Disk full and a read-only data folder while saving: a clear message, previous data intact.

The chat store (app/store.py) raises StoreError, whose message the app shows in its notice
banner; the engine's array files (engine/arrayfile.py: saved sessions, KV caches) raise
FileSaveError, which SessionStore turns into a SaveResult reason and merlin-cli prints. In
every case the data saved before is unchanged, no temporary file is left behind, and saving
works again once the disk has room. See faults.py for how the faults are made (real ENOSPC
from /dev/full, SQLite's own SQLITE_FULL at a page limit, chmod or EROFS for read-only).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from faults import full_disk_for_new_files, read_only

from merlin.app.model.store import DB_NAME, Store, StoreError
from merlin.engine import arrayfile
from merlin.engine.arrayfile import FileSaveError
from merlin.engine.generate import Finished
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import SESSION_SUFFIX, STALE_TEMP_SECONDS, Session, SessionStore

GREEDY = dict(sampling=SamplingParams(temperature=0.0), max_new_tokens=3, ignore_eos=True)


# ---- the chat store ------------------------------------------------------------------------


def filled_store(folder: Path) -> tuple[Store, int, list]:
    store = Store(folder)
    cid = store.create_conversation("before")
    store.add_message(cid, "user", "a question saved before")
    aid = store.add_message(cid, "assistant", "", state="streaming")
    store.update_message(aid, "an answer saved before", state="done")
    return store, cid, snapshot(store, cid)


def snapshot(store: Store, cid: int) -> list:
    return [(r.id, r.role, r.text, r.state, r.images) for r in store.messages(cid)]


def assert_intact(folder: Path, cid: int, before: list) -> None:
    raw = sqlite3.connect(folder / DB_NAME)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        raw.close()
    store = Store(folder)
    try:
        assert snapshot(store, cid) == before
    finally:
        store.close()


def fill_the_disk(store: Store) -> None:
    """SQLite's page limit: the database cannot grow, and SQLite answers SQLITE_FULL,
    exactly what it answers when a write gets ENOSPC."""
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def test_store_on_a_full_disk(tmp_path):
    store, cid, before = filled_store(tmp_path)
    fill_the_disk(store)
    big = "a long question " * 2000  # needs new pages
    for save in (
        lambda: store.add_message(cid, "user", big),
        lambda: store.update_message(before[1][0], big),
        lambda: store.create_conversation(big),
    ):
        with pytest.raises(StoreError) as e:
            save()
        assert "disk is full" in str(e.value) and str(tmp_path) in str(e.value)
        assert "saved before are intact" in str(e.value)
        assert not store._db.in_transaction  # rolled back: the next save can start
        assert snapshot(store, cid) == before
    # an image on a full disk: the kernel's ENOSPC, the temporary file removed
    images = sorted(store.image_dir.iterdir())
    with full_disk_for_new_files() as made, pytest.raises(StoreError) as e:
        store.import_image_bytes(b"\x89PNG picture bytes" * 1000, "png", "lake.png")
    assert made and "lake.png" in str(e.value) and "disk is full" in str(e.value)
    assert sorted(store.image_dir.iterdir()) == images
    # room again: the same store saves
    store._db.execute("PRAGMA max_page_count = 1073741823")
    store.add_message(cid, "user", big)
    store.close()
    again = Store(tmp_path)
    assert snapshot(again, cid)[: len(before)] == before
    assert again.messages(cid)[-1].text == big
    again.close()


def test_store_in_a_read_only_data_folder(tmp_path):
    store, cid, before = filled_store(tmp_path)
    store.close()
    with read_only(tmp_path) as how:
        try:
            store = Store(tmp_path)
        except StoreError as e:  # SQLite may need to write even to open (WAL index)
            message = str(e)
        else:
            assert snapshot(store, cid) == before  # the history can still be read
            with pytest.raises(StoreError) as e:
                store.add_message(cid, "user", "a new question")
            message = str(e.value)
            assert not store._db.in_transaction
            with pytest.raises(StoreError, match="read-only") as e:
                store.import_image_bytes(b"picture", "png", "lake.png")
            store.close()
        assert "read-only" in message and str(tmp_path) in message, (how, message)
        assert "MERLIN_DATA_DIR" in message
    assert_intact(tmp_path, cid, before)
    assert not [p for p in (tmp_path / "images").iterdir()]


def test_store_folder_turns_read_only_while_the_app_runs(tmp_path):
    """A data folder remounted read-only under the running app: SQLite refuses writes
    (query_only gives its SQLITE_READONLY); the message says so, nothing saved is lost."""
    store, cid, before = filled_store(tmp_path)
    store._db.execute("PRAGMA query_only = ON")
    with pytest.raises(StoreError, match="read-only"):
        store.update_message(before[1][0], "a changed answer", state="done")
    assert snapshot(store, cid) == before
    store.close()
    assert_intact(tmp_path, cid, before)


def test_the_app_shows_the_message_and_keeps_the_text(qtbot, demo_dir, tmp_path, monkeypatch):
    """The window on a full disk: the notice banner says so, the typed message stays in the
    box, the history is unchanged; with room again the same message is sent."""
    from PySide6.QtCore import Qt

    from merlin.app.settings import AppSettings
    from merlin.app.widgets.window import MainWindow

    monkeypatch.setenv("MERLIN_DATA_DIR", str(tmp_path))
    w = MainWindow(
        model_folder=str(demo_dir), settings=AppSettings(language="en", max_new_tokens=4)
    )
    qtbot.addWidget(w)
    w.show()
    try:
        qtbot.waitUntil(lambda: w.controller.loading is None, timeout=120_000)
        fill_the_disk(w.store)
        text = "please remember this " * 300
        w.composer.edit.setPlainText(text)
        qtbot.keyClick(w.composer.edit, Qt.Key_Return)
        assert "disk is full" in w.notice_banner.text() and w.notice_banner.isVisible()
        assert w.composer.text() == text and not w.controller.busy
        assert not [m for c in w.store.conversations() for m in w.store.messages(c.id)]
        w.store._db.execute("PRAGMA max_page_count = 1073741823")
        qtbot.keyClick(w.composer.edit, Qt.Key_Return)
        qtbot.waitUntil(lambda: not w.controller.busy, timeout=60_000)
        rows = w.store.messages(w.controller.current_id)
        assert [r.text for r in rows if r.role == "user"] == [text]
    finally:
        w.close()


# ---- engine array files: saved sessions, KV caches -----------------------------------------


def save_array(path: Path, value: float) -> None:
    arrayfile.write(path, "test", {"v": value}, [arrayfile.array_spec("a", np.full(1000, value))])


def read_value(path: Path) -> float:
    with arrayfile.Reader(path, "test") as r:
        a = r.read("a")
        assert np.all(a == r.meta["v"])
        return r.meta["v"]


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_array_file_on_a_full_disk_real_enospc(tmp_path, monkeypatch):
    """The temporary file is made a link to /dev/full: the kernel's own ENOSPC mid-write.
    (A link planted there beforehand is removed: replace_file.create_temporary, O_EXCL.)"""
    from merlin.engine import replace_file

    path = tmp_path / "chat.msession"
    save_array(path, 1.0)
    before = path.read_bytes()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with monkeypatch.context() as m:
        m.setattr(replace_file, "create_temporary", lambda t, _replaced: t.symlink_to("/dev/full"))
        with pytest.raises(FileSaveError) as e:
            save_array(path, 2.0)
    assert "disk is full" in str(e.value) and str(tmp_path) in str(e.value)
    assert not tmp.is_symlink() and leftovers(tmp_path) == []
    assert path.read_bytes() == before and read_value(path) == 1.0
    tmp.symlink_to("/dev/full")  # planted: removed, never written through
    save_array(path, 2.0)  # room again
    assert read_value(path) == 2.0 and not tmp.is_symlink()


class _FailingFile:
    """A file whose writes fail once `limit` bytes went through."""

    def __init__(self, f, limit: int, err: int):
        self.f, self.limit, self.err, self.n = f, limit, err, 0

    def write(self, b) -> int:
        self.n += len(memoryview(b).cast("B"))
        if self.n > self.limit:
            raise OSError(self.err, os.strerror(self.err))
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


STEPS = ("mkdir", "open", "first write", "last write", "fsync", "replace")


def inject(monkeypatch, step: str, err: int) -> None:
    def fail(*a, **k):
        raise OSError(err, os.strerror(err))

    if step == "mkdir":
        monkeypatch.setattr(Path, "mkdir", fail)
    elif step == "open":
        monkeypatch.setattr(arrayfile, "open", fail, raising=False)
    elif step in ("first write", "last write"):
        limit = 0 if step == "first write" else 8000
        monkeypatch.setattr(
            arrayfile, "open", lambda p, m: _FailingFile(open(p, m), limit, err), raising=False
        )
    elif step == "fsync":
        monkeypatch.setattr(os, "fsync", fail)
    else:
        monkeypatch.setattr(os, "replace", fail)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO])
@pytest.mark.parametrize("step", STEPS)
def test_array_file_write_fails_at_any_step(tmp_path, monkeypatch, step, err):
    path = tmp_path / "chat.msession"
    save_array(path, 1.0)
    before = path.read_bytes()
    inject(monkeypatch, step, err)
    with pytest.raises(FileSaveError) as e:
        save_array(path, 2.0)
    monkeypatch.undo()
    message = str(e.value)
    if err == errno.ENOSPC:
        assert "disk is full" in message
    elif err == errno.EIO:
        assert os.strerror(errno.EIO) in message
    else:
        assert "cannot be written" in message
    assert str(tmp_path) in message
    assert leftovers(tmp_path) == [] and path.read_bytes() == before


def test_array_file_interrupted_write_removes_its_temporary_file(tmp_path):
    """Not a disk error (a bug in a chunk producer, Ctrl-C): the exception goes on, the
    temporary file goes away, the previous file stays."""
    path = tmp_path / "chat.kv"
    save_array(path, 1.0)

    def chunks():
        yield np.zeros(10)
        raise KeyboardInterrupt

    spec = arrayfile.ArraySpec("a", np.dtype(np.float64), (1000,), chunks)
    with pytest.raises(KeyboardInterrupt):
        arrayfile.write(path, "test", {"v": 2.0}, [spec])
    assert leftovers(tmp_path) == [] and read_value(path) == 1.0


def test_session_store_in_a_read_only_folder(demo_model, tmp_path):
    """SessionStore (saved sessions for the app) and Session.save (merlin-cli chat)."""
    folder = tmp_path / "sessions"
    store = SessionStore(folder)
    session = Session(demo_model)
    list(session.ask("Hello?", **GREEDY))
    assert store.save(session, "chat-1").saved
    before = store.path_for("chat-1").read_bytes()
    list(session.ask("And then?", **GREEDY))
    with read_only(folder) as how:
        result = store.save(session, "chat-1")
        assert not result.saved, how
        assert "cannot be written" in result.reason and str(folder) in result.reason
        assert "chat itself is kept" in result.reason
        with pytest.raises(FileSaveError, match="cannot be written"):
            session.save(folder / "other.msession")
        store.set_cap(1)  # eviction cannot delete: no exception, nothing removed
    assert store.path_for("chat-1").read_bytes() == before
    assert leftovers(folder) == []
    restored = Session(demo_model)
    assert restored.restore(store.path_for("chat-1"), load_messages=True).restored
    assert len(restored.messages) == 2  # the turn saved before the folder turned read-only
    assert isinstance(list(session.ask("Still here?", **GREEDY))[-1], Finished)


def test_session_store_removes_what_a_killed_save_left(demo_model, tmp_path):
    """A process killed mid-save leaves `.<name>.<pid>.tmp` (test_kill_during_save.py); the
    next save in the folder deletes it once it is stale, never a save still being written."""
    store = SessionStore(tmp_path)
    stale = tmp_path / f".chat-1{SESSION_SUFFIX}.4242.tmp"
    fresh = tmp_path / f".chat-2{SESSION_SUFFIX}.4243.tmp"
    for p in (stale, fresh):
        p.write_bytes(b"MERLINAF torn")
    old = time.time() - 2 * STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    session = Session(demo_model)
    list(session.ask("Hello?", **GREEDY))
    assert store.save(session, "chat-3").saved
    assert not stale.exists() and fresh.exists()
