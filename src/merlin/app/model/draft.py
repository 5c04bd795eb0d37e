"""What the user typed and has not sent, kept on disk: closing the window, a crash or a power
cut does not lose it, and the next start puts it back in the box.

One draft for the window (the box keeps its text when another chat is opened), in
`<data folder>/draft.txt`, written whole to a temporary file and renamed over the old one, so
a crash mid-write leaves the previous draft. No text: no file. Pictures are not kept (they
stay on disk where they came from; the store's copies of unsent ones are collected).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

DRAFT_FILE = "draft.txt"
MAX_DRAFT_CHARS = 1_000_000  # a larger file is not ours to load
log = logging.getLogger(__name__)


def load_draft(folder: Path | str) -> str:
    """The draft kept in folder ('' if none, or unreadable)."""
    path = Path(folder) / DRAFT_FILE
    try:
        if path.stat().st_size > 4 * MAX_DRAFT_CHARS:
            return ""
        return path.read_text(encoding="utf-8", errors="replace")[:MAX_DRAFT_CHARS]
    except OSError:
        return ""


def save_draft(folder: Path | str, text: str) -> bool:
    """Keep text as the draft (an empty or blank text removes it); False if the folder cannot
    be written (logged: the box still holds the text)."""
    path = Path(folder) / DRAFT_FILE
    try:
        if not text.strip():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return True
        fd, tmp = tempfile.mkstemp(prefix=".draft-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text[:MAX_DRAFT_CHARS])
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True
    except OSError as e:
        log.warning("the draft was not saved in %s: %s", path.parent, e)
        return False
