"""Conversations in SQLite: versioned schema, WAL, every change its own committed transaction.

Qt-free. Durability: WAL mode. A commit is visible at once and survives a crash of the app; a
background thread (`Syncer`) then makes it survive a power cut too, by syncing the WAL file
(what `synchronous=FULL` does inside the commit), normally within milliseconds. The caller's
thread (the GUI thread) does not wait for the disk at each commit: with `synchronous=FULL` it
did, and an fsync took up to 150-215 ms on a busy disk, which froze the window while an answer
streamed. The app commits each user message before its answer is generated and the
answer while it streams (at most every half second), so a crash loses at most the last second
of an answer. A message whose answer was streaming when the process died is marked
`interrupted` the next time the store opens. Images are content-addressed files under
`images/` next to the database, written atomically (temp file, fsync, rename) before the row
that uses them.

Failures to write (a full disk, a read-only data folder) raise StoreError with a message for the
user; the failed transaction is rolled back, so what was saved before stays as it was and the
store keeps working once there is space again (tests/robustness/test_save_faults.py).

Chats are trees of message versions since schema 2 (store_tree.py walks them; messages()
returns the path shown). Store is the one class that writes the database, every method one
committed transaction (an import: short ones, store_import.py); the layout, the tree walk,
errors and syncing are in their own modules.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from merlin.app.model import store_import
from merlin.app.model import store_schema as schema
from merlin.app.model import store_tree as tree
from merlin.app.model.draft import draft_image_files
from merlin.app.model.file_lock import share_running, try_lock
from merlin.app.model.store_errors import (
    SQLITE_BUSY,
    SQLITE_CANTOPEN,
    SQLITE_FULL,
    SQLITE_LOCKED,
    SQLITE_PERM,
    SQLITE_READONLY,
    StoreError,
    sqlite_code,
    why_not_saved,
)
from merlin.app.model.store_sync import Syncer
from merlin.engine.tokenizer import clean_text

SCHEMA_VERSION = 3
DB_NAME = "chats.sqlite3"
IMAGE_DIR = "images"
RUNNING_LOCK = "running.lock"  # every Merlin open on the folder holds it shared (_recover)
log = logging.getLogger(__name__)
AT_END = object()  # add_message's default parent: the last message of the path shown
MESSAGE_STATES = ("done", "streaming", "stopped", "error", "interrupted", "queued")

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a replaced answer gets a new id
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    text TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'done',
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS message_images (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    ext TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (message_id, position)
);
CREATE INDEX IF NOT EXISTS message_images_by_sha ON message_images(sha256);
"""

# version -> SQL that brings a database from version-1 to version
_MIGRATIONS = {1: _SCHEMA_V1, 2: schema.BRANCHES_V2, 3: schema.THINKING_MIGRATION}


@dataclass(frozen=True)
class ImageRef:
    """An image kept by the store: content hash, file extension, the name the user saw; in
    a message, the image-token budget it was sent with (None: the settings' default), so
    later turns read it as it was read then."""

    sha256: str
    ext: str
    name: str
    tokens: int | None = None


@dataclass
class MessageRow:
    id: int
    conversation_id: int
    role: str
    text: str
    state: str = "done"
    stats: dict = field(default_factory=dict)
    images: list[ImageRef] = field(default_factory=list)
    parent_id: int | None = None  # None: a first message of its chat
    version: int = 1  # its place among its versions (siblings), 1-based
    versions: int = 1
    reasoning: str | None = None  # a thinking model's reasoning (None: no thinking block)


@dataclass
class ConversationRow:
    id: int
    title: str
    updated: float
    created: float = 0.0


OPEN_TRIES, OPEN_RETRY_S = 4, 0.5
IMAGE_GRACE_S = 120.0  # collect_images leaves image files this recent alone


class Store:
    """The chat database of one data folder. Use from one thread (the GUI thread), except
    image_path and import_image_bytes, which touch files only (an import or export writes and
    reads pictures on a thread of its own while holding the collection: hold_images)."""

    def __init__(self, folder: Path | str | None):
        """folder: the data folder; None keeps everything in memory (nothing is saved). Two
        Merlins opening one new data folder at once may find it busy while the other sets it
        up: opening is tried OPEN_TRIES times, OPEN_RETRY_S apart."""
        for attempt in range(OPEN_TRIES):
            try:
                self._open(folder)
                return
            except StoreError as e:
                if not e.busy or attempt == OPEN_TRIES - 1:
                    raise
            time.sleep(OPEN_RETRY_S)

    def _open(self, folder: Path | str | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.image_dir = (
            self.folder / IMAGE_DIR
            if self.folder
            else Path(tempfile.mkdtemp(prefix="merlin-images-"))
        )
        self.interrupted = 0  # answers found half-written when the store opened
        self._running = None  # this Merlin's shared hold of RUNNING_LOCK (file_lock)
        self._image_holds = 0  # collect_images waits while an import or export is running
        self._syncer: Syncer | None = None
        self._turns = store_import.WriteTurns(self.folder)  # shared with reader() and writer()
        self._second = False  # a reader() or writer() copy: the syncer is not its own
        self._writes = 0  # transactions run by this Store (messages() cache)
        self._shown: tuple[tuple, list[MessageRow]] | None = None  # messages()'s last answer
        try:
            if self.folder:
                self.folder.mkdir(parents=True, exist_ok=True)
            self.image_dir.mkdir(parents=True, exist_ok=True)
            path = str(self.folder / DB_NAME) if self.folder else ":memory:"
            self._db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
            # before anything is written (WAL mode included): is this a Merlin database?
            schema.check_ours(self._db, self.folder, StoreError)
            if self.folder:  # a damaged page would fail a later read (SIGABRT in a slot)
                problems = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
                if problems != "ok":
                    raise self._open_error(sqlite3.DatabaseError(problems))
            if self._db.execute("PRAGMA user_version").fetchone()[0] > SCHEMA_VERSION:
                self._migrate()  # refuses a newer schema, before WAL mode changes the file
            self._db.execute("PRAGMA foreign_keys = ON")
            if self.folder:
                mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"{path}: the database cannot use write-ahead logging.")
                # commits write the WAL without waiting for the disk and never checkpoint
                # here: the syncer syncs and checkpoints, off this thread
                self._db.execute("PRAGMA synchronous = NORMAL")
                self._db.execute("PRAGMA wal_autocheckpoint = 0")
            self._migrate()
            alone = True
            if self.folder:
                try:
                    self._running, alone = share_running(self.folder / RUNNING_LOCK)
                except OSError:  # a read-only folder: nothing can be marked anyway
                    alone = False
            if alone:  # another Merlin open on the folder may be streaming its answers
                self.interrupted = self._recover()
            if self.folder:
                self._drop_abandoned_imports()
            if self.folder:
                self.collect_images()  # pictures of chats deleted within IMAGE_GRACE_S
                self._syncer = Syncer(path)
                self._syncer.request()  # what opening wrote
        except StoreError:
            self._close_quietly()
            raise
        except sqlite3.OperationalError as e:
            self._close_quietly()
            code = sqlite_code(e)
            if code in (SQLITE_BUSY, SQLITE_LOCKED):  # another process holds it: not damage
                message = why_not_saved(self.folder, code, str(e), sqlite=True)
                raise StoreError(message, busy=True) from None
            if code not in (SQLITE_FULL, SQLITE_READONLY, SQLITE_PERM, SQLITE_CANTOPEN):
                raise self._open_error(e) from None
            if code == SQLITE_CANTOPEN:  # a folder we may not write: -wal/-shm cannot be made
                code = SQLITE_READONLY
            raise StoreError(self._why_not_saved(code, str(e))) from None
        except sqlite3.DatabaseError as e:
            self._close_quietly()
            raise self._open_error(e) from None
        except OSError as e:
            self._close_quietly()
            raise StoreError(
                f"The data folder {self.folder} cannot be used ({e.strerror or e}). Check that "
                "it exists and is writable."
            ) from None

    def _open_error(self, e: sqlite3.Error) -> StoreError:
        return StoreError(
            f"The chat database {DB_NAME} in {self.folder} cannot be opened ({e}). It was left "
            "as it is; you can start a new chat history beside it.",
            can_start_new=True,
        )

    def _close_quietly(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._let_go()

    def _let_go(self) -> None:
        if self._running is not None and not self._second:
            self._running.close()
            self._running = None

    @staticmethod
    def start_new_beside(folder: Path | str) -> Path:
        """Move the unusable database of `folder` (and its -wal/-shm files) aside, unchanged,
        to chats.sqlite3.unreadable-<time>, so a new one can be made; returns the new name of
        the old file. Only for a database the user chose to replace (StoreError.can_start_new)."""
        return schema.move_aside(Path(folder) / DB_NAME)

    # ---- schema --------------------------------------------------------------------------

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"The chat database in {self.folder} was written by a newer Merlin (schema "
                f"{version}, this one knows {SCHEMA_VERSION}). Update Merlin to open it; it "
                "was left as it is.",
                can_start_new=True,
            )
        while version < SCHEMA_VERSION:
            with self._transaction():
                # read again under the write lock: another Merlin opening the same new data
                # folder may have migrated meanwhile (its ALTER TABLE again would fail)
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    for statement in _MIGRATIONS[version + 1].split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                    version += 1
                    self._db.execute(f"PRAGMA user_version = {version}")
        # columns an older or partial layout lacks are added (with their defaults)
        with self._transaction():
            schema.complete(self._db, self.folder, StoreError, _SCHEMA_V1 + schema.CHOICES_TABLE)
            for statement in [*schema.INDEXES.split(";"), store_import.PENDING_TABLE]:
                if statement.strip():
                    self._db.execute(statement)

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction. A failure rolls it back (SQLite may have done so
        already, e.g. on a full disk) and a SQLite error becomes a StoreError for the user."""
        self._writes += 1
        with self._turns.writing():  # a long job's next step waits for this (store_import.py)
            yield from self._transaction_now()

    def _transaction_now(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
                if self._syncer is not None:
                    self._syncer.request()
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            code = sqlite_code(e)
            raise StoreError(
                self._why_not_saved(code, str(e)),
                busy=code in (SQLITE_BUSY, SQLITE_LOCKED),
            ) from None

    def _why_not_saved(self, code: int | None, detail: str) -> str:
        """store_errors.why_not_saved for a SQLite error, or, when the database, its -wal or
        its -shm is there but is not a file (SQLite then reports a read-only folder), that."""
        for suffix in ("", "-wal", "-shm") if self.folder else ():
            path = self.folder / f"{DB_NAME}{suffix}"
            if os.path.lexists(path) and not path.is_file():
                return (
                    f"{path} is not a file (a folder or a device?), and Merlin keeps its chats "
                    "there. Move it out of the data folder, then start Merlin again; nothing "
                    "was changed."
                )
        return why_not_saved(self.folder, code, detail, sqlite=True)

    def _recover(self) -> int:
        """Answers left streaming by a Merlin that is gone become interrupted (called only
        when no other Merlin is open on the folder: RUNNING_LOCK)."""
        with self._transaction() as db:
            cur = db.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")
            return cur.rowcount

    def sync(self, timeout: float | None = 10.0) -> bool:
        """Wait until every commit so far is on disk (survives a power cut). False: not yet
        after `timeout` seconds. Only tests and closing need to wait; nothing else does."""
        return self._syncer.wait(timeout) if self._syncer is not None else True

    def close(self) -> None:
        if self._syncer is not None and not self._second:  # a second connection's is borrowed
            self._syncer.close()
        if not self._second:
            self._turns.close()
        with contextlib.suppress(sqlite3.Error):
            self._db.close()  # the last connection: checkpoints (and syncs) what is left
        self._let_go()
        if not self.folder:  # a store in memory: its pictures went to a folder of its own
            shutil.rmtree(self.image_dir, ignore_errors=True)

    def reader(self) -> Store | None:
        """This store on a read-only connection of its own, for a job reading on another
        thread: in WAL mode it reads the last commit and never holds this one's writes back.
        close() it after. A store in memory has no second connection: None."""
        return self._second_connection(writable=False)

    def writer(self) -> Store | None:
        """This store on a connection of its own for a job writing on another thread (an
        import: add_conversations keeps each transaction short and lets this store's
        waiting writes go first between them, store_import.WriteTurns). Its commits are
        synced by this store's syncer. close() it after, before
        this store. None for a store in memory."""
        return self._second_connection(writable=True)

    def _second_connection(self, writable: bool) -> Store | None:
        if not self.folder:
            return None
        other = copy.copy(self)
        other._db = sqlite3.connect(
            str(self.folder / DB_NAME), isolation_level=None, timeout=5.0, check_same_thread=False
        )
        if writable:  # as _open sets its own (per-connection settings)
            for pragma in ("foreign_keys = ON", "synchronous = NORMAL", "wal_autocheckpoint = 0"):
                other._db.execute(f"PRAGMA {pragma}")
        else:
            other._db.execute("PRAGMA query_only = ON")
            other._syncer = None
        other._writes, other._shown, other._second = 0, None, True
        return other

    # ---- conversations -------------------------------------------------------------------

    def create_conversation(self, title: str) -> int:
        now = time.time()
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                (title, now, now),
            )
            return int(cur.lastrowid)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._transaction() as db:
            # unlinked first: the messages' parent_id cascade would otherwise delete a chat's
            # replies one level of trigger recursion each (SQLite stops at 1,000 levels)
            db.execute(
                "UPDATE messages SET parent_id = NULL WHERE conversation_id = ?", (conversation_id,)
            )
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self.collect_images()

    def conversations(self, search: str = "") -> list[ConversationRow]:
        """Most recently updated first; search matches titles and message text."""
        if search.strip():
            like = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%") + "%"
            like = like.replace("_", "\\_")
            rows = self._db.execute(
                "SELECT id, title, updated, created FROM conversations c "
                f"WHERE {store_import.VISIBLE} AND (title LIKE ? ESCAPE '\\' "
                "OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id "
                "AND m.text LIKE ? ESCAPE '\\')) ORDER BY updated DESC, id DESC",
                (like, like),
            )
        else:
            rows = self._db.execute(
                "SELECT id, title, updated, created FROM conversations "
                f"WHERE {store_import.VISIBLE} ORDER BY updated DESC, id DESC"
            )
        return [schema.conversation_row(*r) for r in rows.fetchall()]

    def conversation(self, conversation_id: int) -> ConversationRow | None:
        if not schema.row_id_ok(conversation_id):  # e.g. a huge id from settings.ini
            return None
        row = self._db.execute(
            f"SELECT id, title, updated, created FROM conversations WHERE id = ? AND "
            f"{store_import.VISIBLE}",
            (conversation_id,),
        ).fetchone()
        return schema.conversation_row(*row) if row else None

    # ---- messages ------------------------------------------------------------------------

    def thinking(self, conversation_id: int) -> str | None:
        """The chat's thinking switch: "on", "off", or None (the template's default)."""
        row = self._db.execute(
            "SELECT thinking FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return schema.thinking_switch(row[0]) if row else None

    def set_thinking(self, conversation_id: int, switch: str | None) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE conversations SET thinking = ? WHERE id = ?",
                (schema.thinking_switch(switch), conversation_id),
            )

    def add_message(
        self,
        conversation_id: int,
        role: str,
        text: str,
        images: Sequence[ImageRef] = (),
        state: str = "done",
        parent_id=AT_END,
        reasoning: str | None = None,
    ) -> int:
        """Insert and commit one message (its images must be imported already), below
        parent_id (None: a first message; by default, or when parent_id was deleted meanwhile
        by another window, the last message shown). It becomes the
        version its fork shows: a sibling already there stays, as another version."""
        now = time.time()
        with self._transaction() as db:
            if parent_id is not AT_END and parent_id is not None:
                gone = (
                    db.execute(
                        "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                        (parent_id, conversation_id),
                    ).fetchone()
                    is None
                )
                if gone:  # deleted meanwhile (another window): below the end of the path
                    parent_id = AT_END
                else:  # the path shown goes through it (another window may have switched)
                    tree.show_path_to(db, conversation_id, parent_id)
            if parent_id is AT_END:
                parent_id = tree.last_of_path(db, conversation_id)
            cur = db.execute(
                "INSERT INTO messages (conversation_id, role, text, state, created, updated, "
                "parent_id, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, text, state, now, now, parent_id, reasoning),
            )
            mid = int(cur.lastrowid)
            tree.show_newest(db, conversation_id, parent_id)
            db.executemany(
                "INSERT INTO message_images (message_id, position, sha256, ext, name, tokens) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(mid, i, im.sha256, im.ext, im.name, im.tokens) for i, im in enumerate(images)],
            )
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return mid

    def add_conversations(
        self, conversations: Sequence[tuple], step: int = store_import.IMPORT_STEP
    ) -> list[int]:
        """Add whole conversations (an import): all or nothing, shown at once, in
        transactions of at most `step` messages (store_import.py: the database is never held
        long). Each is (title, created or None, [(role, text, state, stats, [ImageRef, ...],
        reasoning or None), ...]); the images must be imported already; the messages follow
        each other (one branch). Returns the new conversation ids in order."""
        token = uuid.uuid4().hex
        lock = None
        if self.folder:
            path = store_import.lock_path(self.folder, token)
            try:
                path.parent.mkdir(exist_ok=True)
                lock = try_lock(path)
            except OSError as e:
                why = why_not_saved(self.folder, e.errno, e.strerror or str(e))
                raise StoreError(why) from None
        between = self._turns.wait_turn
        try:
            ids = store_import.add_in_steps(self._transaction, conversations, token, step, between)
            between()
            with self._transaction() as db:
                store_import.show(db, token)
            return ids
        except BaseException:
            with contextlib.suppress(StoreError):
                store_import.delete_in_steps(self._transaction, token, step, between)
            raise
        finally:
            if lock is not None:
                lock.close()
                path.unlink(missing_ok=True)

    def _drop_abandoned_imports(self) -> None:
        """Delete the hidden chats of imports whose process died (store_import.py)."""
        for token, lock in store_import.abandoned(self._db, self.folder):
            try:
                store_import.delete_in_steps(
                    self._transaction, token, store_import.IMPORT_STEP, self._turns.wait_turn
                )
            finally:
                if lock is not None:
                    lock.close()
                    store_import.lock_path(self.folder, token).unlink(missing_ok=True)

    def update_message(
        self,
        message_id: int,
        text: str | None = None,
        state: str | None = None,
        stats: dict | None = None,
        reasoning: str | None = None,
    ) -> None:
        sets, args = ["updated = ?"], [time.time()]
        if reasoning is not None:
            sets.append("reasoning = ?")
            args.append(reasoning)
        if text is not None:
            sets.append("text = ?")
            args.append(text)
        if state is not None:
            sets.append("state = ?")
            args.append(state)
        if stats is not None:
            sets.append("stats = ?")
            args.append(json.dumps(stats))
        with self._transaction() as db:
            db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, message_id))

    def delete_messages_from(self, conversation_id: int, message_id: int) -> int:
        """Delete message_id and every message below it (in every branch); returns the count.
        Its fork then shows its newest remaining sibling."""
        with self._transaction() as db:
            if not db.execute(
                "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                (message_id, conversation_id),
            ).fetchone():
                return 0
            ids = tree.subtree(db, message_id)
            # all unlinked before any is deleted (as in delete_conversation)
            for sql in ("UPDATE messages SET parent_id = NULL", "DELETE FROM messages"):
                for i in range(0, len(ids), 500):
                    chunk = ids[i : i + 500]
                    db.execute(f"{sql} WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            return len(ids)

    # ---- versions (the tree of a chat: store_tree.py) -------------------------------------

    def versions(self, message_id: int) -> list[int]:
        """The ids of the versions of message_id (it and its siblings), oldest first."""
        if not schema.row_id_ok(message_id):
            return []
        return tree.versions(self._db, message_id)

    def select_version(self, message_id: int) -> bool:
        """Show message_id instead of its siblings (and below it, the branch it leads to, as
        it was last shown). Committed; False if there is no such message."""
        if not schema.row_id_ok(message_id):
            return False
        with self._transaction() as db:
            return tree.choose(db, message_id)

    def message_count(self, conversation_id: int) -> int:
        """Every message of the conversation, in all branches."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        return int(row[0])

    def messages(self, conversation_id: int) -> list[MessageRow]:
        """The messages the conversation shows: the selected version at each fork, in order
        (every other caller sees a linear chat). The versions: versions() and the rows'
        version/versions.

        The rows are shared with later calls until the database changes (a chat of thousands
        of messages took 0.3 s to read and parse, and the window asks for it several times a
        turn): read them, never modify them."""
        if not schema.row_id_ok(conversation_id):
            return []
        # another connection's commit changes data_version; this one's, _writes
        key = (conversation_id, self._writes, self._db.execute("PRAGMA data_version").fetchone())
        if self._shown is not None and self._shown[0] == key:
            return list(self._shown[1])
        rows = self._read_messages(conversation_id)
        self._shown = (key, rows)
        return list(rows)

    def _read_messages(self, conversation_id: int) -> list[MessageRow]:
        path = {step.id: step for step in tree.selected_path(self._db, conversation_id)}
        rows = self._db.execute(
            "SELECT id, conversation_id, role, text, state, stats, reasoning FROM messages "
            "WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        images: dict[int, list[ImageRef]] = {}
        for mid, sha, ext, name, tokens in self._db.execute(
            "SELECT mi.message_id, mi.sha256, mi.ext, mi.name, mi.tokens FROM message_images mi "
            "JOIN messages m ON m.id = mi.message_id WHERE m.conversation_id = ? "
            "ORDER BY mi.message_id, mi.position",
            (conversation_id,),
        ):
            if schema.image_ref_ok(sha, ext):  # never a path outside images/
                budget = schema.image_tokens(tokens)
                images.setdefault(mid, []).append(ImageRef(sha, ext, str(name), budget))
        out = []
        for mid, cid, role, text, state, stats, reasoning in rows:
            step = path.get(mid)
            if step is None:  # another version's branch
                continue
            row = schema.message_row(mid, cid, role, text, state, stats)
            if row is not None:  # a row no Merlin wrote (bad role, id) is left out
                role, text, state, stats_d = row
                out.append(
                    MessageRow(
                        mid,
                        cid,
                        role,
                        text,
                        state,
                        stats_d,
                        images.get(mid, []),
                        step.parent_id,
                        step.version,
                        step.versions,
                    )  # fmt: skip
                )
                out[-1].reasoning = schema.optional_text(reasoning) if role == "assistant" else None
        return out

    # ---- images --------------------------------------------------------------------------

    def image_path(self, ref: ImageRef) -> Path:
        return self.image_dir / f"{ref.sha256}.{ref.ext}"

    def import_image(self, source: Path | str, name: str | None = None) -> ImageRef:
        """Copy an image file into the store (content-addressed, atomic). Returns its ref."""
        source = Path(source)
        data = source.read_bytes()
        return self.import_image_bytes(
            data, source.suffix.lstrip(".") or "img", name or source.name
        )

    def keep_image(self, ref: ImageRef) -> bool:
        """Whether ref's file is in the store (then marked in use again, so a collection
        spares it for IMAGE_GRACE_S more)."""
        path = self.image_path(ref)
        try:
            os.utime(path)
        except OSError:
            return False
        return path.is_file()

    def import_image_bytes(self, data: bytes, ext: str, name: str) -> ImageRef:
        # the stored name's extension is ASCII letters and digits (store_schema.image_ref_ok
        # reads no other back): full-width "ｐｎｇ" of an input method is "png", "jpé" "jp"
        name = clean_text(name)  # a file name's bytes that are not UTF-8 (SQLite takes none)
        ext = unicodedata.normalize("NFKC", ext).lower()
        ext = "".join(ch for ch in ext if ch.isascii() and ch.isalnum())[:8] or "img"
        sha = hashlib.sha256(data).hexdigest()
        ref = ImageRef(sha, ext, name)
        target = self.image_path(ref)
        if target.is_file() and target.stat().st_size == len(data):
            with contextlib.suppress(OSError):
                os.utime(target)  # in use again: collect_images spares it for a while
            return ref
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".incoming-", dir=self.image_dir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException as e:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if not isinstance(e, OSError):
                raise
            why = why_not_saved(self.image_dir, e.errno, e.strerror or str(e))
            raise StoreError(f"The image {name} was not saved. {why}") from None
        return ref

    def hold_images(self, held: bool = True) -> None:
        """Hold (or, held=False, release) image collection: while an import or export reads or
        writes pictures on another thread, a deleted chat's pictures stay until the next
        collection, which the last release runs."""
        self._image_holds += 1 if held else -1
        if self._image_holds < 0:
            raise RuntimeError("image collection released more often than held")
        if not held and not self._image_holds:
            self.collect_images()

    def collect_images(self) -> int:
        """Delete image files that neither a message nor the unsent draft (model/draft.py)
        refers to (and leftovers of interrupted writes), except those written or reused in
        the last IMAGE_GRACE_S seconds: another Merlin on the same data folder may be about
        to commit the rows that refer to them (an import writes its pictures before its
        transaction). Those go at a later collection. Nothing while held (hold_images)."""
        if self._image_holds:
            return 0
        used = {
            f"{sha}.{ext}"
            for sha, ext in self._db.execute("SELECT DISTINCT sha256, ext FROM message_images")
        }
        if self.folder:
            drafted = draft_image_files(self.folder)  # pictures of the unsent message
            if drafted is None:
                return 0  # a draft that cannot be read may name any of them
            used |= drafted
        removed, now = 0, time.time()
        for path in self.image_dir.iterdir():
            if path.name not in used:
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime < IMAGE_GRACE_S:
                        continue
                    path.unlink()
                    removed += 1
        return removed
