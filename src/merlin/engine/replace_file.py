"""Replacing a file the user named, atomically, as if it had been written in place.

An atomic save writes a temporary file beside the target and renames it over the target. Done
naively that rename (a) replaces a symlink by a regular file, leaving the file it pointed to
stale, and (b) gives the file the temporary's permissions, so a private (0600) chat becomes
readable by everyone. `target` follows the link first, so the temporary goes beside the real
file (a rename within one folder) and the link stays; `create_temporary` makes the temporary
with no more permissions than the file it replaces before anything is written into it, and
`keep_permissions` gives it exactly that file's bits before the rename. Keeping permissions is
best effort: a file system that cannot (vfat, some FUSE and SMB mounts) still gets the save.
`replacing` is the whole save for a writer that needs nothing else (engine/arrayfile.py does
the same steps itself, with its own error messages and its test seams).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path


def target(path: Path | str) -> Path:
    """The file a save to `path` replaces: the end of its symlinks if it is one and its folder
    exists (a dangling link's target is created), else path itself (a link into a folder that
    is gone, or a loop, is replaced as a plain save would)."""
    path = Path(path)
    if not path.is_symlink():
        return path
    real = Path(os.path.realpath(path))
    return real if real.parent.is_dir() and not real.is_symlink() else path


def temporary_name(path: Path, tag: str = "") -> Path:
    """The temporary beside `path` a save of this process writes: hidden, named after the
    file, cut to 200 bytes of it so that a name near the file system's 255 still has a
    temporary (one of 245 could never be saved)."""
    name = os.fsdecode(os.fsencode(path.name)[:200])
    return path.with_name(f".{name}.{os.getpid()}{tag}.tmp")


def _mode(path: Path | str) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def create_temporary(tmp: Path | str, replaced: Path | str) -> None:
    """Create `tmp` empty, new (O_EXCL: never through a link planted there; a leftover of a
    dead process is removed first), with the permissions of `replaced` less the umask, or
    the usual ones for a new file; the caller then opens it for writing ("wb" keeps them): a
    private file's contents are never readable by others while they are written."""
    mode = _mode(replaced)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    os.close(os.open(tmp, flags, 0o666 if mode is None else mode))


def keep_permissions(tmp: Path | str, replaced: Path | str) -> None:
    """Give `tmp` the permission bits of `replaced` if that file exists (a new file keeps the
    ones it was created with); best effort."""
    mode = _mode(replaced)
    if mode is not None:
        with contextlib.suppress(OSError):
            os.chmod(tmp, mode)


@contextlib.contextmanager
def replacing(path: Path | str) -> Iterator:
    """A file open for binary writing whose contents replace `path` when the block ends:
    through a symlink to its target, flushed to disk, with the replaced file's permissions.
    On an exception (a full disk, Ctrl-C) the temporary goes and `path` is as it was."""
    path = target(path)
    tmp = temporary_name(path, f".{secrets.token_hex(4)}")
    try:
        create_temporary(tmp, path)
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        keep_permissions(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
