"""Imported chats are added in short transactions, hidden until the last one shows them all.

An import of a big export (tens of thousands of messages) in one transaction held the
database for seconds: on the GUI thread the window froze; on a connection of its own the
window's writes (a streamed answer's saves) waited, and past SQLite's busy timeout they
failed. So an import writes at most IMPORT_STEP messages a transaction, and between two it
lets a write of this process that is waiting go first (WriteTurns: SQLite's busy handler
retries only now and then, and a writer starting its next transaction at once would keep the
lock for the whole import). Each chat it adds
has a row in `pending_imports` naming the import until the last transaction deletes those
rows: Store.conversations() never lists a chat with such a row, so the import still appears
all at once, or not at all.

Each import holds an exclusive lock (file_lock) on `imports/<token>.lock` in the data folder
while it runs. An import that fails deletes what it added; one whose process died (crash,
power cut) leaves its hidden chats, which the next opening of the store deletes once it can
take the lock (an import still running in another Merlin holds it). The table is made at
every opening, without a schema version: an older Merlin does not know it and would show a
half-imported chat, nothing worse.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from merlin.app.model.file_lock import try_lock

try:
    import fcntl
except ImportError:  # not a POSIX system: other Merlins are not waited for
    fcntl = None

IMPORT_STEP = 400  # messages a transaction: ~5 ms here, a few tens on a board's core
IMPORTS_DIR = "imports"
PENDING_TABLE = """
CREATE TABLE IF NOT EXISTS pending_imports (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    token TEXT NOT NULL
)"""
VISIBLE = "id NOT IN (SELECT conversation_id FROM pending_imports)"  # a conversations filter

Transaction = Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
TURN_WAIT_S = 10.0  # the longest a step waits for the writes ahead of it
WRITES_LOCK = "writes.lock"  # shared by each Merlin while it writes (WriteTurns)
OTHER_WRITER_POLL_S = 0.002


class WriteTurns:
    """The connections of one Store in this process (its own and its writer()'s) count
    their transactions in progress or waiting for the lock; a long job (an import) waits
    between its steps until none is. Other Merlins on the same data folder are waited for
    too: while this process has any, it holds a shared flock on `writes.lock` in the data
    folder, and the job's turn comes when it can take that file's exclusive lock (at once
    let go)."""

    def __init__(self, folder: Path | None = None) -> None:
        self._active = 0
        self._idle = threading.Condition()
        self._path = folder / WRITES_LOCK if folder is not None else None
        self._shared = None  # the file holding this process's shared lock (opened at need)

    @contextlib.contextmanager
    def writing(self):
        with self._idle:
            self._active += 1
            if self._active == 1:
                self._share(fcntl.LOCK_SH if fcntl else 0)
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                if self._active == 0:
                    self._share(fcntl.LOCK_UN if fcntl else 0)
                self._idle.notify_all()

    def _share(self, operation: int) -> None:
        if self._path is None or fcntl is None:
            return
        try:
            if self._shared is None:
                self._shared = open(self._path, "a+")  # noqa: SIM115 (kept for the next write)
            fcntl.flock(self._shared.fileno(), operation)
        except OSError:  # a folder that cannot hold it: other Merlins are not waited for
            self._path = None

    def wait_turn(self) -> None:
        """Until no other transaction of this process, nor of another Merlin on the same
        folder, is in progress or waiting (at most TURN_WAIT_S each)."""
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0, TURN_WAIT_S)
        if self._path is None or fcntl is None:
            return
        deadline = time.monotonic() + TURN_WAIT_S
        try:
            with open(self._path, "a+") as f:  # its own open file: not the shared lock's
                while True:
                    try:
                        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return  # let go as the file closes
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            return
                        time.sleep(OTHER_WRITER_POLL_S)
        except OSError:
            return

    def close(self) -> None:
        """The store is closed: its lock file too (a write still running on a writer() copy
        no longer holds other Merlins' imports back)."""
        with self._idle:
            self._path = None  # never opened again
            if self._shared is not None:
                self._shared.close()
                self._shared = None


def lock_path(folder: Path, token: str) -> Path:
    return folder / IMPORTS_DIR / f"{token}.lock"


def add_in_steps(
    transaction: Transaction,
    conversations: Sequence[tuple],
    token: str,
    step: int,
    between: Callable[[], None],
) -> list[int]:
    """Add the conversations (Store.add_conversations' tuples), at most `step` messages a
    transaction, calling between() before each; each chat marked pending under `token`;
    the ids in order. They stay hidden: show(token) makes them visible, delete_in_steps
    removes them."""
    now = time.time()
    ids: list[int] = []
    items = list(_items(conversations))
    parent = None
    for start in range(0, len(items), step):
        between()
        with transaction() as db:
            for item in items[start : start + step]:
                if item[0] == "chat":
                    _, title, created = item
                    cur = db.execute(
                        "INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                        (title, created if created is not None else now, now),
                    )
                    ids.append(int(cur.lastrowid))
                    db.execute(
                        "INSERT INTO pending_imports (conversation_id, token) VALUES (?, ?)",
                        (ids[-1], token),
                    )
                    parent = None
                    continue
                _, role, text, state, stats, images, reasoning = item
                cur = db.execute(
                    "INSERT INTO messages (conversation_id, role, text, state, stats, "
                    "created, updated, parent_id, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (ids[-1], role, text, state, json.dumps(stats), now, now, parent, reasoning),
                )
                parent = int(cur.lastrowid)
                db.executemany(
                    "INSERT INTO message_images (message_id, position, sha256, ext, name, "
                    "tokens) VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (parent, i, im.sha256, im.ext, im.name, im.tokens)
                        for i, im in enumerate(images)
                    ],
                )
    return ids


def _items(conversations: Sequence[tuple]) -> Iterator[tuple]:
    for title, created, messages in conversations:
        yield ("chat", title, created)
        for message in messages:
            yield ("message", *message)


def show(db: sqlite3.Connection, token: str) -> None:
    db.execute("DELETE FROM pending_imports WHERE token = ?", (token,))


def delete_in_steps(
    transaction: Transaction, token: str, step: int, between: Callable[[], None]
) -> None:
    """Delete an import's hidden chats, at most `step` messages a transaction (newest first,
    each unlinked from its parent first: no cascade goes down a chat), then the chats."""
    chats = "SELECT conversation_id FROM pending_imports WHERE token = ?"
    while True:
        between()
        with transaction() as db:
            ids = [
                r[0]
                for r in db.execute(
                    f"SELECT id FROM messages WHERE conversation_id IN ({chats}) "
                    "ORDER BY id DESC LIMIT ?",
                    (token, step),
                )
            ]
            if not ids:
                db.execute(f"DELETE FROM conversations WHERE id IN ({chats})", (token,))
                return
            marks = ",".join("?" * len(ids))
            db.execute(f"UPDATE messages SET parent_id = NULL WHERE id IN ({marks})", ids)
            db.execute(f"DELETE FROM messages WHERE id IN ({marks})", ids)


def abandoned(db: sqlite3.Connection, folder: Path) -> list[tuple[str, object]]:
    """(token, its lock, held now, or None) of every import with hidden chats whose process
    is gone; close each lock after deleting its chats."""
    out = []
    for (token,) in db.execute("SELECT DISTINCT token FROM pending_imports").fetchall():
        token = str(token)
        if not (token.isalnum() and token.isascii() and len(token) <= 64):
            out.append((token, None))  # not one of ours: no lock file names it
            continue
        path = lock_path(folder, token)
        path.parent.mkdir(exist_ok=True)
        lock = try_lock(path)
        if lock is not None:
            out.append((token, lock))
    return out
