"""The chat store's tree of versions (schema 2) and the migration from schema 1. Qt-free.

The migration is checked on tests/fixtures/chats_v1/, a data folder written by the schema-1
Store itself (tests/fixtures/make_chats_v1.py, run with the code before branches), and on a
larger database made with the schema-1 layout kept here, word for word as that code had it."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from merlin.app.model.store import DB_NAME, SCHEMA_VERSION, Store

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "chats_v1"

# the schema-1 layout of src/merlin/app/model/store.py before branches (commit 34c4809)
SCHEMA_V1 = """
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


def v1_messages(path: Path) -> dict[int, list[tuple]]:
    """What the schema-1 Store.messages() read: each chat's rows by id."""
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    out: dict[int, list[tuple]] = {}
    for cid, mid, role, text, state, stats in db.execute(
        "SELECT conversation_id, id, role, text, state, stats FROM messages "
        "ORDER BY conversation_id, id"
    ):
        out.setdefault(cid, []).append((mid, role, text, state, stats))
    db.close()
    return out


def shown(store: Store, cid: int) -> list[tuple]:
    return [(r.role, r.text, r.version, r.versions) for r in store.messages(cid)]


def test_a_schema_1_folder_made_by_the_old_code_keeps_every_message_in_order(tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(FIXTURE, folder)
    before = v1_messages(folder / DB_NAME)
    assert sum(map(len, before.values())) == 9 and len(before) == 3
    store = Store(folder)
    assert store.schema_version == SCHEMA_VERSION >= 2
    assert store.interrupted == 1  # the answer v1 left streaming
    for cid, rows in before.items():
        now = store.messages(cid)
        assert [r.id for r in now] == [mid for mid, *_ in rows]
        assert [(r.role, r.text) for r in now] == [(role, text) for _, role, text, *_ in rows]
        want_states = [("interrupted" if s == "streaming" else s) for *_, s, _ in rows]
        assert [r.state for r in now] == want_states
        assert all(r.versions == 1 for r in now)
        assert [r.parent_id for r in now] == [None] + [r.id for r in now[:-1]]
        assert store.message_count(cid) == len(rows)
    boats = store.messages(1)
    assert boats[0].images[0].name == "lake.png" and store.image_path(boats[0].images[0]).is_file()
    assert store.messages(2)[1].stats == {"tokens": 3, "token_ids": [1, 2, 3]}
    # the migrated chat branches like a new one: a regenerated first answer
    alt = store.add_message(1, "assistant", "Two small boats.", parent_id=boats[0].id)
    assert shown(store, 1) == [
        ("user", "How many boats?", 1, 1),
        ("assistant", "Two small boats.", 2, 2),
    ]
    store.select_version(boats[1].id)
    assert [r.id for r in store.messages(1)] == [r.id for r in boats]
    store.close()
    # reopened: already schema 2, nothing migrated twice
    again = Store(folder)
    assert [r.id for r in again.messages(1)] == [r.id for r in boats]
    assert again.versions(alt) == [boats[1].id, alt]
    again.close()


def test_a_large_schema_1_database_with_interleaved_chats_migrates_in_order(tmp_path):
    rng = random.Random(5)
    folder = tmp_path / "data"
    folder.mkdir()
    db = sqlite3.connect(folder / DB_NAME)
    db.executescript(SCHEMA_V1)
    db.execute("PRAGMA user_version = 1")
    chats = list(range(1, 8))
    for cid in chats:
        db.execute("INSERT INTO conversations VALUES (?, ?, 0, 0)", (cid, f"chat {cid}"))
    expected: dict[int, list[int]] = {cid: [] for cid in chats}
    next_id = 1
    for n in range(600):
        cid = rng.choice(chats)
        next_id += rng.choice([1, 1, 1, 2, 5])  # v1 deleted regenerated answers: gaps
        role = "user" if len(expected[cid]) % 2 == 0 else "assistant"
        db.execute(
            "INSERT INTO messages VALUES (?, ?, ?, ?, 'done', '{}', 0, 0)",
            (next_id, cid, role, f"message {n}"),
        )
        expected[cid].append(next_id)
    db.commit()
    db.close()
    store = Store(folder)
    for cid in chats:
        assert [r.id for r in store.messages(cid)] == expected[cid]
    store.close()


def test_versions_switching_and_new_versions(tmp_path):
    store = Store(tmp_path)
    cid = store.create_conversation("t")
    q1 = store.add_message(cid, "user", "q1")
    a1 = store.add_message(cid, "assistant", "a1")
    q2 = store.add_message(cid, "user", "q2")
    a2 = store.add_message(cid, "assistant", "a2")
    # an edit of q2: a sibling below a1, shown; the old q2 and its answer stay
    q2b = store.add_message(cid, "user", "q2 edited", parent_id=a1)
    a2b = store.add_message(cid, "assistant", "a2 edited")  # below the path's end: q2b
    assert shown(store, cid) == [
        ("user", "q1", 1, 1),
        ("assistant", "a1", 1, 1),
        ("user", "q2 edited", 2, 2),
        ("assistant", "a2 edited", 1, 1),
    ]
    assert store.versions(q2) == [q2, q2b] and store.versions(a2b) == [a2b]
    assert store.select_version(q2)
    assert [r.id for r in store.messages(cid)] == [q1, a1, q2, a2]
    # regenerate a2 twice: 3 versions, the newest shown
    a2c = store.add_message(cid, "assistant", "a2 again", parent_id=q2)
    a2d = store.add_message(cid, "assistant", "a2 third", parent_id=q2)
    assert shown(store, cid)[-1] == ("assistant", "a2 third", 3, 3)
    assert store.versions(a2) == [a2, a2c, a2d]
    store.select_version(a2)
    assert shown(store, cid)[-1] == ("assistant", "a2", 1, 3)
    # a fork remembers its choice below it: back to q2b shows a2b, back to q2 shows a2
    store.select_version(q2b)
    assert [r.id for r in store.messages(cid)] == [q1, a1, q2b, a2b]
    store.select_version(q2)
    assert [r.id for r in store.messages(cid)] == [q1, a1, q2, a2]
    # a first message edited: a second root
    q1b = store.add_message(cid, "user", "q1 edited", parent_id=None)
    assert [r.id for r in store.messages(cid)] == [q1b]
    store.select_version(q1)
    assert [r.id for r in store.messages(cid)] == [q1, a1, q2, a2]
    store.close()
    # the choices are in the database: a reopened store shows the same path
    again = Store(tmp_path)
    assert [r.id for r in again.messages(cid)] == [q1, a1, q2, a2]
    assert not again.select_version(10**9) and again.versions(10**9) == []
    # delete_messages_from deletes a version and all below it; the fork shows the newest left
    assert again.delete_messages_from(cid, q2) == 4  # q2, a2, a2c, a2d
    assert [r.id for r in again.messages(cid)] == [q1, a1, q2b, a2b]
    assert again.message_count(cid) == 5
    again.close()


def test_deleting_a_conversation_removes_every_branch_and_its_images(tmp_path):
    store = Store(tmp_path)
    png = FIXTURE / "images"
    img = next(png.iterdir())
    ref = store.import_image(img, "x.png")
    keep = store.create_conversation("keep")
    store.add_message(keep, "user", "stay")
    cid = store.create_conversation("t")
    q = store.add_message(cid, "user", "q")
    a = store.add_message(cid, "assistant", "a")
    store.add_message(cid, "assistant", "b", parent_id=q)
    store.add_message(cid, "user", "q other", [ref], parent_id=None)  # in a hidden branch now
    store.select_version(q)
    store.select_version(a)
    assert store.message_count(cid) == 4
    old = time.time() - 3600  # written long ago (a fresh picture waits: store.IMAGE_GRACE_S)
    os.utime(store.image_path(ref), (old, old))
    store.delete_conversation(cid)
    db = store._db
    assert store.message_count(cid) == 0
    assert db.execute("SELECT COUNT(*) FROM message_choices").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM message_images").fetchone()[0] == 0
    assert not store.image_path(ref).exists()
    assert [r.text for r in store.messages(keep)] == ["stay"]
    store.close()


@pytest.mark.parametrize("damage", ["parent elsewhere", "parent gone", "self parent", "loop"])
def test_a_damaged_tree_hides_no_message(tmp_path, damage):
    store = Store(tmp_path)
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    other = store.add_message(b, "user", "elsewhere")
    q = store.add_message(a, "user", "q")
    x = store.add_message(a, "assistant", "x")
    parent = {"parent elsewhere": other, "parent gone": 10**6, "self parent": x, "loop": x}
    store._db.execute("PRAGMA foreign_keys = OFF")
    store._db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (parent[damage], x))
    if damage == "loop":  # q below x below q
        store._db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (x, q))
        store._db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (q, x))
    store._db.execute("PRAGMA foreign_keys = ON")
    if damage == "loop":  # q's parent is not older than q: q is a first message, x below it
        assert [r.id for r in store.messages(a)] == [q, x] and store.versions(x) == [x]
        store.close()
        return
    # x counts as a first message of its chat: a version of q
    assert store.versions(x) == [q, x]
    assert [r.id for r in store.messages(a)] == [x]
    store.select_version(q)
    assert [r.id for r in store.messages(a)] == [q]
    store.close()


def test_export_writes_the_selected_path_and_import_makes_a_linear_chat(tmp_path):
    from merlin.app.model import chat_export

    store = Store(tmp_path / "a")
    cid = store.create_conversation("branched")
    q = store.add_message(cid, "user", "q")
    a1 = store.add_message(cid, "assistant", "first answer")
    store.add_message(cid, "user", "follow-up")
    store.add_message(cid, "assistant", "second answer", parent_id=q)
    store.select_version(a1)
    doc = chat_export.export_json(store, [cid])
    texts = [m["text"] for m in doc["conversations"][0]["messages"]]
    assert texts == ["q", "first answer", "follow-up"]
    md = chat_export.conversation_markdown(store, cid)
    assert "follow-up" in md and "second answer" not in md
    other = Store(tmp_path / "b")
    (new,) = chat_export.import_conversations(other, chat_export.parse_document(doc))
    path = other.messages(new)
    assert [r.text for r in path] == texts
    assert [r.parent_id for r in path] == [None, path[0].id, path[1].id]
    assert all(r.versions == 1 for r in path) and other.message_count(new) == 3
    # the imported chat branches like any other
    other.add_message(new, "assistant", "again", parent_id=path[0].id)
    assert [r.text for r in other.messages(new)] == ["q", "again"]
    store.close()
    other.close()


def _chat(n: int) -> list[tuple]:
    roles = ("user", "assistant")
    return [(roles[i % 2], f"m{i}", "done", {}, [], None) for i in range(n)]


def test_a_long_chat_and_a_long_tail_can_be_deleted(tmp_path):
    """A chat is a chain of replies (parent_id, ON DELETE CASCADE): deleting it or an early
    message deleted the replies one level of trigger recursion each, and SQLite stops at
    1,000 levels ("too many levels of trigger recursion": a chat of over ~1,000 messages
    could not be deleted). The other chats are untouched."""
    store = Store(tmp_path)
    keep, long_chat, tail = store.add_conversations(
        [("keep", None, _chat(6)), ("long", None, _chat(1500)), ("tail", None, _chat(1300))]
    )
    store.delete_conversation(long_chat)
    assert store.conversation(long_chat) is None and store.message_count(long_chat) == 0
    rows = store.messages(tail)
    assert store.delete_messages_from(tail, rows[2].id) == 1298
    assert [r.text for r in store.messages(tail)] == ["m0", "m1"]
    assert [r.text for r in store.messages(keep)] == [f"m{i}" for i in range(6)]
    store.close()
    # the indexes that keep a deletion from scanning the table for each message
    db = sqlite3.connect(tmp_path / DB_NAME)
    plan = db.execute("EXPLAIN QUERY PLAN SELECT 1 FROM messages WHERE parent_id = 5").fetchall()
    assert "USING" in str(plan) and "INDEX" in str(plan), plan
    db.close()
