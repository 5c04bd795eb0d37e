"""What the user wrote and has not sent, kept on disk: closing the window, a crash or a power
cut does not lose it, and the next start puts it back in the box.

Each running window keeps its draft in a file of its own, `<data folder>/drafts/<id>.json`:

    {"text": "...", "images": [{"sha256": ..., "ext": ..., "name": ..., "path": ...,
                                "detail": ...}, ...]}

written whole to a temporary file and renamed over the old one, so a crash mid-write leaves
the previous draft; no text and no pictures: no file. The window holds an exclusive lock
(flock) on `drafts/<id>.lock` while it runs, so two Merlins on one data folder never write
over each other's draft. A starting window takes over the drafts whose owners are gone
(their lock is free: closed, crashed or powered off), merged into one (texts joined, pictures
in turn), and deletes them once its own draft is saved. `draft.json` and `draft.txt` in the
data folder, the one draft of earlier versions, are taken over the same way.

Pictures are the chat store's copies (sha256.ext in its image folder, made when they were
attached; `path` is where the picture came from, used when the store has no copy): the
store's collection of unused pictures spares every draft file's (draft_image_files).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from merlin.app.model.file_lock import try_lock

DRAFTS_DIR = "drafts"
LEGACY_FILES = ("draft.json", "draft.txt")  # the one draft of a folder (before session 27's end)
MAX_DRAFT_CHARS = 8 << 20  # the longest message an import takes (chat_export.MAX_TEXT_CHARS)
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


def merged(drafts: list[Draft]) -> Draft:
    """One draft of several: the texts joined by a blank line, the pictures in turn (each
    once), at most MAX_DRAFT_CHARS and MAX_DRAFT_IMAGES."""
    text = "\n\n".join(d.text.strip("\n") for d in drafts if d.text.strip())
    images, seen = [], set()
    for d in drafts:
        for i in d.images:
            key = (i.file_name or i.path, i.name)
            if key not in seen and len(images) < MAX_DRAFT_IMAGES:
                seen.add(key)
                images.append(i)
    return Draft(text[:MAX_DRAFT_CHARS], images)


class DraftUnreadable(Exception):
    """A draft file is there but cannot be read or is not a draft."""


def draft_files(folder: Path | str) -> list[Path]:
    """Every draft file in the data folder (each window's, then the legacy ones), oldest
    first."""
    folder = Path(folder)
    own = sorted((folder / DRAFTS_DIR).glob("*.json")) if (folder / DRAFTS_DIR).is_dir() else []
    legacy = [folder / name for name in LEGACY_FILES if (folder / name).is_file()]

    def age(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(own, key=age) + legacy


def read_draft_file(path: Path) -> Draft:
    """The draft in one file (empty if it is gone); DraftUnreadable if it cannot be used."""
    try:
        if path.stat().st_size > 8 * MAX_DRAFT_CHARS:
            raise DraftUnreadable(f"{path} is too large for a draft")
        raw = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".txt":  # the text-only draft of session 26
            return Draft(raw[:MAX_DRAFT_CHARS])
        return _parse(raw)
    except FileNotFoundError:
        return Draft()
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nesting
        raise DraftUnreadable(f"{path}: {e}") from None


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
        if not isinstance(fields["path"], str):  # a name's bytes may be no UTF-8: a str still
            continue
        if not all(_usable(v) for k, v in fields.items() if k != "path"):
            continue
        if not _safe_name(fields["sha256"], fields["ext"]):
            continue  # not a store file name: never a path out of the image folder
        draft.images.append(DraftImage(**fields))
        if len(draft.images) == MAX_DRAFT_IMAGES:
            break
    return draft


def _usable(value) -> bool:
    """A string UTF-8 can hold (JSON may carry a lone surrogate; a picture entry with one is
    left out)."""
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


def write_draft_file(path: Path, draft: Draft) -> None:
    """Keep draft in path, whole or not at all (an empty draft removes the file); OSError
    if it cannot be written."""
    if draft.empty:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    images = [asdict(i) for i in draft.images]
    data = {"text": draft.text[:MAX_DRAFT_CHARS], "images": images}
    fd, tmp = tempfile.mkstemp(prefix=".draft-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            json.dump(data, f)  # \u escapes: any str, a lone surrogate too
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def draft_image_files(folder: Path | str) -> set[str] | None:
    """The store's image files the drafts in folder use (the collection spares them); None
    if a draft file is there and cannot be read (then nothing may be collected)."""
    files: set[str] = set()
    for path in draft_files(folder):
        try:
            files |= {i.file_name for i in read_draft_file(path).images if i.file_name}
        except DraftUnreadable:
            return None
    return files


class DraftKeeper:
    """One window's draft file and lock in a data folder (see the module docstring).
    OSError from the constructor if the folder cannot be written."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        drafts = self.folder / DRAFTS_DIR
        drafts.mkdir(parents=True, exist_ok=True)
        name = uuid.uuid4().hex[:16]
        self.path = drafts / f"{name}.json"
        self._lock = try_lock(drafts / f"{name}.lock")
        self._taken: list[tuple[Path, object]] = []  # drafts taken over: (file, its lock)
        self.problem = ""  # why the last save failed ("": it did not)

    def take_over(self, max_images: int = MAX_DRAFT_IMAGES) -> Draft:
        """The drafts of windows that are gone, merged; they are deleted at the next save.
        Unreadable ones are left where they are (logged), and so are those whose text or
        pictures would take the merged one past MAX_DRAFT_CHARS or max_images (the box's
        limit): a later start takes them over."""
        drafts, chars, images = [], 0, 0
        for path in draft_files(self.folder):
            if path == self.path or any(path == p for p, _ in self._taken):
                continue
            lock = None
            if path.parent.name == DRAFTS_DIR:
                lock = try_lock(path.with_suffix(".lock"))
                if lock is None:
                    continue  # its window is running
            try:
                draft = read_draft_file(path)
            except DraftUnreadable as e:
                log.warning("a draft was not taken over: %s", e)
                draft = None
            too_much = draft is not None and (
                chars + 2 + len(draft.text) > MAX_DRAFT_CHARS
                or images + len(draft.images) > max_images
            )
            if too_much and drafts:
                log.warning("a draft was left for a later start: %s", path)
                draft = None
            if draft is None:
                if lock is not None:
                    lock.close()
                continue
            drafts.append(draft)
            chars += 2 + len(draft.text)
            images += len(draft.images)
            self._taken.append((path, lock))
        self._remove_stale_locks()
        return merged(drafts)

    def _remove_stale_locks(self) -> None:
        """Lock files of windows that are gone and left no draft (a crash, nothing typed)."""
        own = self.path.with_suffix(".lock")
        for lock_path in (self.folder / DRAFTS_DIR).glob("*.lock"):
            if lock_path == own or lock_path.with_suffix(".json").exists():
                continue
            lock = try_lock(lock_path)
            if lock is not None:
                with contextlib.suppress(OSError):
                    lock_path.unlink()
                lock.close()

    def save(self, draft: Draft) -> bool:
        """Keep this window's draft; then the drafts taken over are deleted. False if it
        cannot be written (logged, the reason in self.problem: the box still holds it)."""
        try:
            write_draft_file(self.path, draft)
        except OSError as e:
            log.warning("the draft was not saved in %s: %s", self.path.parent, e)
            self.problem = e.strerror or str(e)
            return False
        self.problem = ""
        for path, lock in self._taken:
            with contextlib.suppress(OSError):
                path.unlink()
            if lock is not None:
                with contextlib.suppress(OSError):
                    path.with_suffix(".lock").unlink()
                lock.close()
        self._taken = []
        return True

    def close(self) -> None:
        """The window is gone: its lock is freed (its draft, if any, stays for the next
        start); a lock file with no draft beside it is removed."""
        if self._lock is not None:
            if not self.path.exists():
                with contextlib.suppress(OSError):
                    self.path.with_suffix(".lock").unlink()
            self._lock.close()
            self._lock = None
