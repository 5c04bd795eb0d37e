"""What the user wrote and has not sent, kept on disk: closing the window, a crash or a power
cut does not lose it, and the next start puts it back in the box.

One draft for the window (the box keeps it when another chat is opened), in
`<data folder>/draft.json`:

    {"text": "...", "images": [{"sha256": ..., "ext": ..., "name": ..., "path": ...,
                                "detail": ...}, ...]}

written whole to a temporary file and renamed over the old one, so a crash mid-write leaves
the previous draft. Pictures are the chat store's copies (sha256.ext in its image folder,
made when they were attached; `path` is where the picture came from, used when the store has
no copy): the store's collection of unused pictures spares the ones named here
(draft_image_files). No text and no pictures: no file. `draft.txt`, the text-only draft of
earlier versions, is read when there is no draft.json and removed at the next save.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

DRAFT_FILE = "draft.json"
LEGACY_DRAFT_FILE = "draft.txt"  # text only (before pictures were kept)
MAX_DRAFT_CHARS = 1_000_000  # a larger text is not ours to load
MAX_DRAFT_IMAGES = 64
log = logging.getLogger(__name__)


@dataclass
class DraftImage:
    sha256: str  # "" when the store had no copy (then only `path` can bring it back)
    ext: str
    name: str  # what the user saw
    path: str  # where it came from
    detail: str = ""  # the chip's detail ("" = the settings' default)

    @property
    def file_name(self) -> str:
        """Its file in the store's image folder ("" when it has none)."""
        return f"{self.sha256}.{self.ext}" if self.sha256 else ""


@dataclass
class Draft:
    text: str = ""
    images: list[DraftImage] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.text.strip() and not self.images


class DraftUnreadable(Exception):
    """draft.json is there but cannot be read or is not a draft."""


def load_draft(folder: Path | str) -> Draft:
    """The draft kept in folder (empty if none, or unreadable)."""
    try:
        return read_draft(folder)
    except DraftUnreadable as e:
        log.warning("the draft in %s was not read: %s", folder, e)
        return Draft()


def read_draft(folder: Path | str) -> Draft:
    """The draft kept in folder (empty if none); DraftUnreadable if draft.json is there and
    cannot be used."""
    folder = Path(folder)
    try:
        path = folder / DRAFT_FILE
        if path.stat().st_size > 8 * MAX_DRAFT_CHARS:
            raise DraftUnreadable(f"{path} is too large for a draft")
        return _parse(path.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nesting
        raise DraftUnreadable(str(e)) from None
    try:
        legacy = folder / LEGACY_DRAFT_FILE
        if legacy.stat().st_size > 4 * MAX_DRAFT_CHARS:
            return Draft()
        return Draft(legacy.read_text(encoding="utf-8", errors="replace")[:MAX_DRAFT_CHARS])
    except OSError:
        return Draft()


def _parse(raw: str) -> Draft:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("not a draft")
    text = data.get("text")
    text = text if isinstance(text, str) else ""
    # a lone surrogate (JSON can carry one, UTF-8 cannot) becomes "?"
    draft = Draft(text[:MAX_DRAFT_CHARS].encode("utf-8", "replace").decode("utf-8"))
    images = data.get("images")
    for item in images if isinstance(images, list) else []:
        if not isinstance(item, dict):
            continue
        fields = {k: item.get(k) for k in ("sha256", "ext", "name", "path", "detail")}
        if not all(_usable(v) for v in fields.values()):
            continue
        if not _safe_name(fields["sha256"], fields["ext"]):
            continue  # not a store file name: never a path out of the image folder
        draft.images.append(DraftImage(**fields))
        if len(draft.images) == MAX_DRAFT_IMAGES:
            break
    return draft


def _usable(value) -> bool:
    """A string that can be written back (JSON may carry a lone surrogate, which UTF-8
    cannot)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _safe_name(sha256: str, ext: str) -> bool:
    if not sha256:
        return True
    return sha256.isalnum() and sha256.isascii() and ext.isalnum() and ext.isascii()


def save_draft(folder: Path | str, draft: Draft) -> bool:
    """Keep the draft (an empty one removes the file); False if the folder cannot be written
    (logged: the box still holds the draft)."""
    folder = Path(folder)
    path = folder / DRAFT_FILE
    try:
        if draft.empty:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        else:
            images = [asdict(i) for i in draft.images]
            data = {"text": draft.text[:MAX_DRAFT_CHARS], "images": images}
            fd, tmp = tempfile.mkstemp(prefix=".draft-", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="ascii") as f:
                    json.dump(data, f)  # \u escapes: any str, a lone surrogate too
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        with contextlib.suppress(FileNotFoundError):
            (folder / LEGACY_DRAFT_FILE).unlink()  # this file supersedes it
        return True
    except OSError as e:
        log.warning("the draft was not saved in %s: %s", folder, e)
        return False


def draft_image_files(folder: Path | str) -> set[str] | None:
    """The store's image files the draft in folder uses (the collection spares them); None
    if draft.json is there and cannot be read (then nothing may be collected)."""
    try:
        return {i.file_name for i in read_draft(folder).images if i.file_name}
    except DraftUnreadable:
        return None
