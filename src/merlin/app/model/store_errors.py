"""The chat store's errors and what they tell the user.

StoreError carries a message meant for the user. SQLite result codes and errnos are told
apart here: SQLITE_ERROR is 1 like EPERM and SQLITE_BUSY 5 like EIO, so a schema error must
never read as "the data folder is read-only".
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path


class StoreError(Exception):
    """The chat store cannot be used or could not save; the message is meant for the user.
    can_start_new: the database file itself is unusable (damaged, foreign, newer, unknown
    schema), so the app may offer to start a new one beside it (Store.start_new_beside).
    busy: another connection held the database (SQLITE_BUSY / SQLITE_LOCKED): a later try
    may succeed."""

    def __init__(self, message: str, can_start_new: bool = False, busy: bool = False):
        super().__init__(message)
        self.can_start_new = can_start_new
        self.busy = busy


# SQLite result codes (the primary code, the low byte of sqlite_errorcode). They are not
# errnos: SQLITE_ERROR is 1 like EPERM, SQLITE_BUSY 5 like EIO; never compare them to errno.
SQLITE_ERROR, SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED = 1, 3, 5, 6
SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN = 8, 11, 13, 14
SQLITE_NOTADB = 26


def why_not_saved(folder: Path | None, code: int | None, detail: str, sqlite: bool = False) -> str:
    """What to tell the user when writing to the store failed (code: an errno for OSError,
    or with sqlite=True a primary SQLite result code for sqlite3.Error)."""
    where = str(folder) if folder else "memory"
    if sqlite:
        full = code == SQLITE_FULL
        read_only = code in (SQLITE_READONLY, SQLITE_PERM)
        if code in (SQLITE_BUSY, SQLITE_LOCKED):
            return (
                f"The chat database in {where} is in use by another program (is Merlin open "
                f"twice?) and stayed locked ({detail}). Close the other program and try again; "
                "nothing was changed."
            )
        if code in (SQLITE_CORRUPT, SQLITE_NOTADB):
            return f"The chat database in {where} is damaged ({detail}); nothing was saved."
    else:
        full = code in (errno.ENOSPC, errno.EDQUOT)
        read_only = code in (errno.EROFS, errno.EACCES, errno.EPERM)
    if full:
        return (
            f"The disk is full: nothing more can be saved in {where}. Free some space and try "
            "again; the chats saved before are intact."
        )
    if read_only:
        return (
            f"The data folder {where} is read-only ({detail}): nothing can be saved there. Make "
            "it writable, or start Merlin with MERLIN_DATA_DIR set to another folder; the chats "
            "saved before are intact."
        )
    return f"The chat database in {where} could not be written ({detail})."


def sqlite_code(e: sqlite3.Error) -> int | None:
    code = getattr(e, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None
