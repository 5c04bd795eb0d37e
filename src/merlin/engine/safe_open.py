"""Open a file for reading only if it is a regular file, without ever blocking on it.

Merlin reads files people point it at (checkpoint folders, images, saved sessions). A plain
open() of a FIFO blocks until someone writes to it, a device may block or have side effects,
and a folder fails late with a confusing error. Every file the engine reads goes through
open_regular(), which:

1. stat()s the path (following symlinks) and refuses anything that is not a regular file;
2. opens it with O_NONBLOCK (a FIFO swapped in after the stat cannot block the open) and
   checks the open descriptor with fstat() again (no race between the check and the use);
3. clears O_NONBLOCK, so reads of the regular file behave as usual.

Errors are raised as the caller's error type (CheckpointError for checkpoint files,
InputError for images and options, FileFormatError for saved sessions...) with a message
that names the file and says what it is instead: "is a named pipe (FIFO), not a file".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InputError

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """'a folder', 'a named pipe (FIFO)', ... for a st_mode that is not a regular file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


class NotRegularFile(InputError):
    """The path exists but is a folder, FIFO, device or socket."""


def _missing(path: Path, what: str, error: type[Exception]) -> Exception:
    return error(f"{path}: {what} does not exist.")


def check_regular(path, what: str = "the file", error: type[Exception] = InputError):
    """os.stat_result of `path` if it is a regular file; `error` saying what it is if not
    (missing, a folder, a FIFO, a device...). Never opens the file."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _missing(path, what, error) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise error(
            f"{path}: {what} cannot be read ({getattr(e, 'strerror', None) or e})."
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: {what} is {kind_of(st.st_mode)}, not a regular file. Choose a file.")
    return st


def is_regular(path) -> bool:
    """True if `path` is a regular file (following symlinks); never blocks, never raises."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(
    path,
    what: str = "the file",
    error: type[Exception] = InputError,
    *,
    text: bool = False,
    encoding: str = "utf-8",
):
    """A file object for reading `path` (binary, or text with `text=True`), opened only if it
    is a regular file; `error` with a message otherwise. Never blocks on a FIFO or device."""
    path = Path(path)
    check_regular(path, what, error)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise _missing(path, what, error) from None
    except OSError as e:
        raise error(f"{path}: {what} cannot be read ({e.strerror or e}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise error(
                f"{path}: {what} is {kind_of(st.st_mode)}, not a regular file. Choose a file."
            )
        try:
            import fcntl

            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
        except (ImportError, OSError, AttributeError):
            pass  # regular files never block anyway
        if text:
            return os.fdopen(fd, "r", encoding=encoding)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(
    path, what: str = "the file", error: type[Exception] = InputError, limit: int | None = None
) -> bytes:
    """The whole file, opened with open_regular(); `error` if it is larger than `limit`."""
    with open_regular(path, what, error) as f:
        if limit is not None:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise error(
                    f"{path}: {what} is {size:,} bytes, more than the {limit:,} bytes this "
                    "file can reasonably be. It is damaged or not the right file."
                )
            # read what fstat says plus one byte (a read of `limit` would allocate it all)
            data = f.read(size + 1)
            if len(data) > size:
                data += f.read(limit + 1 - len(data)) if len(data) <= limit else b""
            if len(data) > limit:
                raise error(f"{path}: {what} grew past {limit:,} bytes while being read.")
            return data
        return f.read()


def read_text(
    path, what: str = "the file", error: type[Exception] = InputError, limit: int | None = None
) -> str:
    """read_bytes() decoded as UTF-8 (UnicodeDecodeError propagates for the caller to word)."""
    return read_bytes(path, what, error, limit).decode("utf-8")
