"""An import is added in short transactions, hidden until the last one (model/store_import.py):
the window's own writes never wait for the whole import, a failure leaves nothing, and the
hidden chats of an import whose process died are deleted by the next opening."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

import pytest

from merlin.app.model import store_import
from merlin.app.model.file_lock import try_lock
from merlin.app.model.store import Store, StoreError


def chats(n_chats=3, per=10, tag="imported"):
    return [
        (
            f"{tag} {c}",
            None,
            [
                ("user" if i % 2 == 0 else "assistant", f"{tag} {c}.{i}", "done", {}, [], None)
                for i in range(per)
            ],
        )
        for c in range(n_chats)
    ]


def rows(folder):
    """Every row of the chat tables, read raw (hidden ones too)."""
    db = sqlite3.connect(folder / "chats.sqlite3")
    try:
        return {
            t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("conversations", "messages", "pending_imports")
        }
    finally:
        db.close()


def test_an_import_is_hidden_until_its_last_step_and_never_holds_the_window(tmp_path):
    store = Store(tmp_path)
    own = store.create_conversation("mine")
    writer = store.writer()
    steps, go_on = [], threading.Event()
    real = writer._transaction

    @contextlib.contextmanager
    def pausing():
        with real() as db:
            yield db
        steps.append(time.perf_counter())
        if len(steps) == 2:  # between two steps: the window writes and lists
            assert go_on.wait(20)

    writer._transaction = pausing
    result = {}
    job = threading.Thread(target=lambda: result.update(ids=writer.add_conversations(chats(), 7)))
    job.start()
    deadline = time.monotonic() + 20
    while len(steps) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(steps) == 2
    t0 = time.perf_counter()
    store.add_message(own, "user", "written while the import runs")
    assert time.perf_counter() - t0 < 1.0  # the busy timeout is 5 s
    assert [c.title for c in store.conversations()] == ["mine"]
    assert store.conversations("imported") == []
    assert rows(tmp_path)["pending_imports"] > 0
    go_on.set()
    job.join(20)
    writer.close()
    ids = result["ids"]
    assert len(ids) == 3 and len(steps) == 6  # 3 chats + 30 messages: 5 steps of 7, then show
    assert {c.id for c in store.conversations()} == {own, *ids}
    assert [m.text for m in store.messages(ids[1])] == [f"imported 1.{i}" for i in range(10)]
    assert rows(tmp_path)["pending_imports"] == 0
    assert list((tmp_path / store_import.IMPORTS_DIR).iterdir()) == []  # its lock is gone
    store.close()


def slow_writer(store: Store) -> Store:
    """store.writer() with each transaction 30 ms longer (an import on a board's SD card)."""
    writer = store.writer()
    real = writer._transaction

    @contextlib.contextmanager
    def slow():
        with real() as db:
            time.sleep(0.03)
            yield db

    writer._transaction = slow
    return writer


def test_the_window_writes_between_the_steps_of_a_running_import(tmp_path):
    """An import running freely on its own thread (steps made slow, as on a board's SD card)
    while the window saves now and then: each save waits for one step at most, not for the
    whole import (its next step had started microseconds after each commit, before SQLite's
    busy handler retried: a save waited for the import, or failed after 5 s)."""
    store = Store(tmp_path)
    own = store.create_conversation("mine")
    writer = slow_writer(store)
    job = threading.Thread(target=lambda: writer.add_conversations(chats(4, 400), 40))
    t0 = time.perf_counter()
    job.start()
    waits = []
    while job.is_alive():
        t = time.perf_counter()
        store.add_message(own, "user", "saved while importing")
        waits.append(time.perf_counter() - t)
        time.sleep(0.05)
    job.join()
    took = time.perf_counter() - t0
    writer.close()
    assert took > 0.9 and len(waits) >= 5  # 41 steps of 30 ms and more
    assert max(waits) < 0.4, (max(waits), took)
    assert len(store.conversations()) == 5
    store.close()


def test_a_failing_step_leaves_nothing(tmp_path):
    store = Store(tmp_path)
    store.create_conversation("mine")
    before = rows(tmp_path)
    bad = chats()
    bad[2][2][4] = ("robot", "not a role", "done", {}, [], None)  # CHECK fails in step 3
    with pytest.raises(StoreError):
        store.add_conversations(bad, step=7)
    assert rows(tmp_path) == before
    assert [c.title for c in store.conversations()] == ["mine"]
    assert list((tmp_path / store_import.IMPORTS_DIR).iterdir()) == []
    store.close()


def hidden_import(store, token):
    """Steps of an import under `token` whose process then died (never shown)."""
    return store_import.add_in_steps(store._transaction, chats(2, 4, token), token, 3, lambda: None)


def test_the_next_opening_deletes_a_dead_imports_chats_not_a_running_ones(tmp_path):
    store = Store(tmp_path)
    store.create_conversation("mine")
    hidden_import(store, "d" * 32)  # dead: nobody holds its lock
    hidden_import(store, "a" * 32)  # alive: another Merlin still importing
    hidden_import(store, "../../not-a-token")  # a crafted row: never a file name
    store.close()
    (tmp_path / store_import.IMPORTS_DIR).mkdir(exist_ok=True)
    alive = try_lock(store_import.lock_path(tmp_path, "a" * 32))
    assert alive is not None
    reopened = Store(tmp_path)
    assert [c.title for c in reopened.conversations()] == ["mine"]
    assert rows(tmp_path) == {"conversations": 3, "messages": 8, "pending_imports": 2}
    reopened.close()
    alive.close()  # its process dies too
    again = Store(tmp_path)
    assert rows(tmp_path) == {"conversations": 1, "messages": 0, "pending_imports": 0}
    assert [c.title for c in again.conversations()] == ["mine"]
    assert not (tmp_path.parent / "not-a-token.lock").exists()
    again.close()


def test_a_store_in_memory_imports_in_steps_too():
    store = Store(None)
    assert store.writer() is None
    ids = store.add_conversations(chats(), step=4)
    assert [c.id for c in store.conversations()] == ids[::-1]
    store.close()


IMPORT_IN_ANOTHER_PROCESS = """
import sys
sys.path.insert(0, {tests!r})
from test_store_import import chats, slow_writer
from merlin.app.model.store import Store

store = Store({folder!r})
writer = slow_writer(store)
print("importing", flush=True)
writer.add_conversations(chats(4, 400), 40)
writer.close()
store.close()
"""


def test_the_window_writes_between_the_steps_of_another_merlins_import(tmp_path):
    """The same with the import in another Merlin on the same data folder: its steps had
    followed each other at once, so every save of this one waited for the whole import
    (100,000 messages: 1.2 s on the GUI thread; past SQLite's 5 s a save failed)."""
    import subprocess
    import sys
    from pathlib import Path

    store = Store(tmp_path)
    own = store.create_conversation("mine")
    script = IMPORT_IN_ANOTHER_PROCESS.format(
        tests=str(Path(__file__).parent), folder=str(tmp_path)
    )
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline() == "importing\n"
    t0 = time.perf_counter()
    waits = []
    while other.poll() is None:
        t = time.perf_counter()
        store.add_message(own, "user", "saved while another Merlin imports")
        waits.append(time.perf_counter() - t)
        time.sleep(0.05)
    took = time.perf_counter() - t0
    assert other.wait() == 0
    assert took > 0.9 and len(waits) >= 5
    assert max(waits) < 0.4, (max(waits), took)
    assert len(store.conversations()) == 5
    store.close()


def test_a_store_closed_while_a_write_runs_lets_other_merlins_go(tmp_path):
    """Closing the store closes its lock file, even under a write still running on another
    connection; the write's end does not open it again."""
    import fcntl

    turns = store_import.WriteTurns(tmp_path)
    with turns.writing():
        turns.close()
    assert turns._shared is None
    with open(tmp_path / store_import.WRITES_LOCK) as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds it
