"""The chat database's layout, checked and completed; rows read back defensively. Qt-free.

Store (store.py) opens a database through these functions, in this order:

1. check_ours(): before anything is written (WAL mode included), a database with tables but
   none of ours and no user_version is someone else's SQLite file: refused untouched
   (StoreError with can_start_new, so the app can offer a new database beside it).
2. the numbered migrations of store.py (CREATE ... IF NOT EXISTS, so a database that already
   has some of our tables is completed rather than refused);
3. complete(): every column the current code reads must exist. A column an older or partial
   layout lacks is added with its default (ALTER TABLE ADD COLUMN: no row is changed); a
   missing column without a sensible default (a message's text, role or conversation) makes
   the database unusable: refused, untouched.

Schema versions (store.py's _MIGRATIONS): 1 the linear chats; 2 branches (BRANCHES_V2): every
message has a parent (NULL: the chat's first message), versions of a message are siblings, and
message_choices remembers which child the conversation shows at each fork (none: the newest).
The migration from 1 links each message to the one before it in its conversation, so an old
chat becomes one branch with every message and its order kept.

Rows are then read through message_row() / conversation_row() / image_ref_ok(), which turn
what a damaged or hand-edited database holds (a stats column holding a list, a text stored as
a blob or NULL, an unknown state, an image hash with a "/" in it) into values the app can
show, or leave the row out. Nothing here raises for a row.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path

OUR_TABLES = ("conversations", "messages", "message_images")
# table -> column -> SQL to add it (None: cannot be added; the database is unusable)
COLUMNS = {
    "conversations": {
        "id": None,
        "title": "TEXT NOT NULL DEFAULT ''",
        "created": "REAL NOT NULL DEFAULT 0",
        "updated": "REAL NOT NULL DEFAULT 0",
        "thinking": "TEXT",  # the chat's thinking switch (THINKING_MIGRATION)
    },
    "messages": {
        "id": None,
        "conversation_id": None,
        "role": None,
        "text": None,
        "state": "TEXT NOT NULL DEFAULT 'done'",
        "stats": "TEXT NOT NULL DEFAULT '{}'",
        "created": "REAL NOT NULL DEFAULT 0",
        "updated": "REAL NOT NULL DEFAULT 0",
        "parent_id": "INTEGER REFERENCES messages(id) ON DELETE CASCADE",
        "reasoning": "TEXT",  # a thinking model's reasoning (THINKING_MIGRATION)
    },
    "message_images": {
        "message_id": None,
        "position": None,
        "sha256": None,
        "ext": "TEXT NOT NULL DEFAULT 'img'",
        "name": "TEXT NOT NULL DEFAULT ''",
        # the image-token budget it was sent with (NULL: the settings' default); added to
        # an older file at opening, which an older Merlin ignores
        "tokens": "INTEGER",
    },
}
# schema 2: the tree of versions (a new column, a new table; no row of version 1 is lost)
CHOICES_TABLE = """
CREATE TABLE IF NOT EXISTS message_choices (
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER NOT NULL,  -- the fork: a message id, 0 for the chat's first messages
    child_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    PRIMARY KEY (conversation_id, parent_id)
);
"""
BRANCHES_V2 = (
    """
ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE;
UPDATE messages SET parent_id = (
    SELECT MAX(p.id) FROM messages p
    WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id
);
"""
    + CHOICES_TABLE
    + "CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(conversation_id, parent_id, id);"
)
# Indexes made at every opening (IF NOT EXISTS, no schema version: an older Merlin ignores
# them). Deleting a message checks the rows that reference it (its replies, by parent_id; its
# fork choices, by child_id): without these, every deleted message scanned the whole table.
INDEXES = """
CREATE INDEX IF NOT EXISTS messages_by_parent_id ON messages(parent_id);
CREATE INDEX IF NOT EXISTS message_choices_by_child ON message_choices(child_id)
"""
# Thinking models (schema 3): an answer's reasoning apart from its text (NULL: the answer
# had no thinking block), and a chat's thinking switch (NULL: the template's default; "on",
# "off"). Nullable columns, so every row an older Merlin wrote stays as it was.
THINKING_MIGRATION = """
ALTER TABLE messages ADD COLUMN reasoning TEXT;
ALTER TABLE conversations ADD COLUMN thinking TEXT
"""
THINKING_SWITCHES = ("on", "off")
MESSAGE_STATES = ("done", "streaming", "stopped", "error", "interrupted", "queued")
_SHA = re.compile(r"[0-9a-f]{64}")
# letters and digits: ASCII since session 34; any script before (read back, never a path)
_EXT = re.compile(r"[^\W_]{1,8}")
MAX_ROW_ID = 2**63 - 1


def _tables(db: sqlite3.Connection) -> set[str]:
    return {
        r[0]
        for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        if not str(r[0]).startswith("sqlite_")
    }


def check_ours(db: sqlite3.Connection, folder, error) -> None:
    """`error` (StoreError, can_start_new) if the database holds tables but is not Merlin's.
    Reads only."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = _tables(db)
    if version == 0 and tables and not tables & set(OUR_TABLES):
        names = ", ".join(sorted(tables)[:5])
        raise error(
            f"{Path(folder or '.') / 'chats.sqlite3'} is an SQLite database of another program "
            f"(tables {names}), not Merlin's chat history. It was left as it is; you can start "
            "a new chat history beside it.",
            can_start_new=True,
        )


def complete(db: sqlite3.Connection, folder, error, create_sql: str) -> None:
    """Create the tables and add the columns an older layout lacks (create_sql: the current
    schema, every statement IF NOT EXISTS); `error` if a column that cannot be added is
    missing. Call inside a transaction."""
    for statement in create_sql.split(";"):
        if statement.strip():
            db.execute(statement)
    for table, columns in COLUMNS.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})").fetchall()}
        for column, sql in columns.items():
            if column in have:
                continue
            if sql is None:
                raise error(
                    f"The chat database in {folder} lacks the column {table}.{column}, which "
                    "no migration can restore; it was left as it is. You can start a new chat "
                    "history beside it.",
                    can_start_new=True,
                )
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql}")


def move_aside(path: Path) -> Path:
    """Rename `path` (and its -wal, -shm) to `<name>.unreadable-<time>`; returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.unreadable-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.unreadable-{stamp}-{n}")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    os.replace(path, target)
    return target


def row_id_ok(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ROW_ID


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return "" if value is None else str(value)


# the keys the app reads from a message's stats (conversation.answer_stats writes them) and
# the values it can use; a stored value of another kind (an import, a hand edit, a newer
# Merlin) is left out rather than crash the chat's display at every opening
_COUNT_STATS = ("tokens", "prompt_tokens", "reused_tokens")
_SECONDS_STATS = ("tokens_per_s", "prefill_ms", "vision_ms", "ttft_ms", "thinking_s")
_TEXT_STATS = ("reason", "error")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_ROW_ID


def _stat_ok(key: str, v) -> bool:
    if key in _COUNT_STATS:
        return _count(v)
    if key in _SECONDS_STATS:
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        return number and 0 <= v < float("inf")
    if key in _TEXT_STATS:
        return isinstance(v, str)
    if key == "notices":
        return isinstance(v, list) and all(isinstance(n, str) for n in v)
    if key == "drafted":  # [start, end] character spans
        return isinstance(v, list) and all(
            isinstance(s, list) and len(s) == 2 and all(_count(i) for i in s) for s in v
        )
    if key == "token_ids":  # thousands an answer: each id is checked where used (history.py)
        return isinstance(v, list)
    return True  # a key this Merlin does not read: kept as it is


def clean_stats(stats: dict) -> dict:
    """A message's stats with every known key of an unusable kind left out."""
    return {k: v for k, v in stats.items() if isinstance(k, str) and _stat_ok(k, v)}


def message_row(mid, cid, role, text, state, stats):
    """(role, text, state, stats dict) of a stored message, or None to leave it out."""
    if role not in ("user", "assistant") or not row_id_ok(mid):
        return None
    if state not in MESSAGE_STATES:
        state = "done"
    try:
        stats_d = json.loads(stats) if isinstance(stats, (str, bytes)) and stats else {}
    except (ValueError, RecursionError):
        stats_d = {}
    if not isinstance(stats_d, dict):  # a list, a number...: the app reads it as a dict
        stats_d = {}
    return role, _text(text), state, clean_stats(stats_d)


def optional_text(value) -> str | None:
    """A nullable text column (reasoning) read back: None stays None."""
    return None if value is None else _text(value)


def thinking_switch(value) -> str | None:
    """A chat's stored thinking switch: "on", "off", or None (anything else)."""
    return value if value in THINKING_SWITCHES else None


def conversation_row(cid, title, updated, created=0.0):
    from merlin.app.model.store import ConversationRow

    def seconds(v) -> float:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

    return ConversationRow(cid, _text(title), seconds(updated), seconds(created))


def image_ref_ok(sha, ext) -> bool:
    """A stored image reference that names a file inside images/ (hex hash, short ext)."""
    return (
        isinstance(sha, str)
        and bool(_SHA.fullmatch(sha))
        and isinstance(ext, str)
        and bool(_EXT.fullmatch(ext))
    )


def image_tokens(value) -> int | None:
    """A message image's stored budget, or None (the default) when it is not a sensible
    count of image tokens (a hand-edited database)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20:
        return value
    return None
