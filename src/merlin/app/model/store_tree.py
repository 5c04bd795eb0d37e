"""The tree of message versions in the chat database (schema 2): which path a chat shows. Qt-free.

Every message has a parent (NULL for a chat's first message); the versions of a message (an
edited question, a regenerated answer) are its siblings, oldest first. At each fork the
conversation remembers the child it shows in message_choices (parent 0 stands for the chat's
first messages); a fork with no choice recorded, or one whose chosen child is gone, shows its
newest child. So a new version is shown by clearing the fork's choice, and switching is one
row. A parent always has a smaller id than its children (it was written first), so the
selected path's ids increase.

The path is walked in Python over (id, parent) pairs of one conversation. A parent counts only
if it is a message of the same chat with a smaller id, so a damaged or hand-edited database (a
parent in another chat, one that is gone, a loop) can neither hide a message nor make the walk
loop: such a message counts as a first message of its chat.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

ROOT = 0  # the fork above a chat's first messages


@dataclass(frozen=True)
class PathStep:
    """One message of the selected path: its id, its parent, its place among its versions."""

    id: int
    parent_id: int | None
    version: int  # 1-based
    versions: int


def _children(db: sqlite3.Connection, conversation_id: int) -> dict[int, list[int]]:
    rows = db.execute(
        "SELECT id, parent_id FROM messages WHERE conversation_id = ? ORDER BY id",
        (conversation_id,),
    ).fetchall()
    ids = {mid for mid, _ in rows}
    children: dict[int, list[int]] = {}
    for mid, parent in rows:
        if parent not in ids or not parent < mid:  # see the module docstring
            parent = ROOT
        children.setdefault(parent, []).append(mid)
    return children


def _choices(db: sqlite3.Connection, conversation_id: int) -> dict[int, int]:
    return dict(
        db.execute(
            "SELECT parent_id, child_id FROM message_choices WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchall()
    )


def selected_path(db: sqlite3.Connection, conversation_id: int) -> list[PathStep]:
    """The messages the conversation shows, first to last."""
    children = _children(db, conversation_id)
    choices = _choices(db, conversation_id)
    path: list[PathStep] = []
    seen: set[int] = set()
    node = ROOT
    while node in children:
        kids = children[node]
        pick = choices.get(node)
        if pick not in kids:
            pick = kids[-1]
        if pick in seen:  # never for a tree; a guard for a damaged database
            break
        seen.add(pick)
        path.append(PathStep(pick, None if node == ROOT else node, kids.index(pick) + 1, len(kids)))
        node = pick
    return path


def last_of_path(db: sqlite3.Connection, conversation_id: int) -> int | None:
    path = selected_path(db, conversation_id)
    return path[-1].id if path else None


def parent_and_conversation(db: sqlite3.Connection, message_id: int) -> tuple[int, int] | None:
    """(the fork above message_id, as ROOT or an id; its conversation), None if not stored."""
    row = db.execute(
        "SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)
    ).fetchone()
    if row is None:
        return None
    cid, parent = row
    ok = (
        isinstance(parent, int)
        and parent < message_id
        and db.execute(
            "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?", (parent, cid)
        ).fetchone()
    )
    return (int(parent) if ok else ROOT), int(cid)


def versions(db: sqlite3.Connection, message_id: int) -> list[int]:
    """The ids of message_id and its siblings (its versions), oldest first; [] if unknown."""
    where = parent_and_conversation(db, message_id)
    if where is None:
        return []
    parent, cid = where
    return children_of(db, cid, parent)


def children_of(db: sqlite3.Connection, conversation_id: int, parent: int) -> list[int]:
    return _children(db, conversation_id).get(parent, [])


def show_newest(db: sqlite3.Connection, conversation_id: int, parent: int | None) -> None:
    """The fork above a new message shows it (its newest child). Inside a transaction."""
    db.execute(
        "DELETE FROM message_choices WHERE conversation_id = ? AND parent_id = ?",
        (conversation_id, ROOT if parent is None else parent),
    )


def show_path_to(db: sqlite3.Connection, conversation_id: int, message_id: int) -> None:
    """Every fork above message_id shows the message on the way to it, so the selected path
    goes through it (a window adding below the last message it shows, while another window
    switched a version further up). Inside a transaction; one read of the chat's tree."""
    children = _children(db, conversation_id)
    parent_of = {kid: parent for parent, kids in children.items() for kid in kids}
    choices = _choices(db, conversation_id)
    node = message_id
    while node in parent_of:
        parent = parent_of[node]
        kids = children[parent]
        shown = choices.get(parent) if choices.get(parent) in kids else kids[-1]
        if shown != node:
            db.execute(
                "INSERT OR REPLACE INTO message_choices (conversation_id, parent_id, child_id) "
                "VALUES (?, ?, ?)",
                (conversation_id, parent, node),
            )
        if parent == ROOT:
            break
        node = parent


def choose(db: sqlite3.Connection, message_id: int) -> bool:
    """Show message_id at its fork (the path below it: its own remembered choices). Inside a
    transaction. False: no such message."""
    where = parent_and_conversation(db, message_id)
    if where is None:
        return False
    parent, cid = where
    db.execute(
        "INSERT OR REPLACE INTO message_choices (conversation_id, parent_id, child_id) "
        "VALUES (?, ?, ?)",
        (cid, parent, message_id),
    )
    return True


def subtree(db: sqlite3.Connection, message_id: int) -> list[int]:
    """message_id and the ids of every message below it, in all branches."""
    rows = db.execute(
        "WITH RECURSIVE below(id) AS (SELECT id FROM messages WHERE id = ? "
        "UNION SELECT m.id FROM messages m JOIN below b ON m.parent_id = b.id) "
        "SELECT id FROM below",
        (message_id,),
    ).fetchall()
    return [int(r[0]) for r in rows]
