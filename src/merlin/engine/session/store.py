"""Saved sessions on disk, bounded: one folder, one file per chat, a size cap.

Files are keyed by the app's chat id (a safe file name, or a hash of the key) and evicted
least recently used first (saving and restoring touch a file). Temporary files of saves that
died mid-write (kill -9, power cut) are deleted once stale. Nothing here raises for disk
trouble: results say what happened, and the reasons are logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import arrayfile
from ..errors import MerlinError
from .persistence import RestoreResult

if TYPE_CHECKING:
    from .core import Session

log = logging.getLogger(__name__)

SESSION_SUFFIX = ".msession"
DEFAULT_STORE_CAP = 4 * 1024**3
# a temporary file of a save (engine.arrayfile) not written to for this long was left by a
# process that died mid-write (kill -9, power cut); SessionStore deletes it
STALE_TEMP_SECONDS = 600


@dataclass
class SaveResult:
    saved: bool
    path: Path | None = None
    file_bytes: int = 0
    ms: float = 0.0
    reason: str = ""  # why not (a sentence to show or log)


@dataclass
class StoreUsage:
    bytes: int
    files: int
    cap_bytes: int
    folder: Path


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def default_store_dir() -> Path:
    env = os.environ.get("MERLIN_SESSION_CACHE")
    if env:
        return Path(os.path.expanduser(env))
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("merlin")) / "sessions"


class SessionStore:
    """Saved sessions in one folder, keyed by the app's chat id, kept under a size cap by
    deleting the least recently used (saved or restored) files. Never raises for disk
    trouble: results say what happened, and the reasons are logged."""

    def __init__(self, folder: Path | str | None = None, cap_bytes: int = DEFAULT_STORE_CAP):
        self.folder = Path(os.path.expanduser(folder)) if folder else default_store_dir()
        self.cap_bytes = int(cap_bytes)

    def path_for(self, key: str) -> Path:
        key = str(key)
        if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}", key):
            key = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self.folder / f"{key}{SESSION_SUFFIX}"

    def _files(self) -> list[Path]:
        try:
            return [p for p in self.folder.glob(f"*{SESSION_SUFFIX}") if p.is_file()]
        except OSError:
            return []

    def usage(self) -> StoreUsage:
        files = self._files()
        total = 0
        for p in files:
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return StoreUsage(total, len(files), self.cap_bytes, self.folder)

    def set_cap(self, cap_bytes: int) -> list[Path]:
        self.cap_bytes = int(cap_bytes)
        return self.enforce_cap()

    def remove_stale_temp_files(self) -> int:
        """Delete what interrupted saves left (`.<name>.<pid>.tmp`, see engine.arrayfile)
        once untouched for STALE_TEMP_SECONDS; a save in progress keeps its file fresh."""
        removed = 0
        try:
            temps = list(self.folder.glob(f".*{SESSION_SUFFIX}.*.tmp"))
        except OSError:
            return 0
        for p in temps:
            try:
                if time.time() - p.stat().st_mtime > STALE_TEMP_SECONDS:
                    p.unlink()
                    removed += 1
            except OSError:
                pass
        return removed

    def enforce_cap(self, keep: Path | None = None, extra: int = 0) -> list[Path]:
        """Delete least recently used files until the folder (plus `extra` bytes about to be
        written) is within the cap; `keep` is never deleted. Returns the deleted paths.
        Leftovers of interrupted saves are removed first."""
        self.remove_stale_temp_files()
        entries = []
        for p in self._files():
            try:
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
            except OSError:
                pass
        entries.sort()
        total = sum(size for _, size, _ in entries) + extra
        removed = []
        for _, size, p in entries:
            if total <= self.cap_bytes:
                break
            if keep is not None and p == keep:
                continue
            try:
                p.unlink()
                total -= size
                removed.append(p)
                log.info("saved session %s deleted to stay under the disk limit", p.name)
            except OSError:
                pass
        return removed

    def save(self, session: Session, key: str) -> SaveResult:
        t0 = time.perf_counter()
        path = self.path_for(key)
        try:
            size = session.estimated_file_bytes()
        except MerlinError as e:
            return SaveResult(False, path, reason=str(e))
        if size > self.cap_bytes:
            reason = (
                f"the session ({format_bytes(size)}) is larger than the saved-session limit "
                f"({format_bytes(self.cap_bytes)}); it was not saved. Raise the limit in the "
                "settings, use a q8 KV cache, or lower the context budget."
            )
            log.warning("%s", reason)
            path.unlink(missing_ok=True)  # a stale older copy would only waste the space
            return SaveResult(False, path, reason=reason)
        old = path.stat().st_size if path.is_file() else 0
        self.enforce_cap(keep=path, extra=max(0, size - old))
        try:
            written = session.save(path)
        except arrayfile.FileSaveError as e:
            reason = f"the session was not saved: {e}. The chat itself is kept."
            log.warning("%s", reason)
            return SaveResult(False, path, reason=reason)
        self.enforce_cap(keep=path)
        return SaveResult(True, path, written, (time.perf_counter() - t0) * 1e3)

    def restore(self, session: Session, key: str) -> RestoreResult:
        return session.restore(self.path_for(key))

    def delete(self, key: str) -> None:
        try:
            self.path_for(key).unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not delete saved session %s: %s", key, e)

    def clear(self) -> int:
        """Delete every saved session; returns the bytes freed."""
        freed = 0
        for p in self._files():
            try:
                size = p.stat().st_size
                p.unlink()
                freed += size
            except OSError:
                pass
        return freed
