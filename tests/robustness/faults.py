"""Disks that refuse to save, for the save-fault tests.

read_only(folder): a folder whose files cannot be written. As a normal user that is chmod a-w
on the folder and everything in it. Root ignores permissions, so for root every write,
create, rename and delete of a path inside the folder raises EROFS (as on a read-only mount),
and SQLite opens databases inside it read-only, as SQLite does itself when it may not write a
database file. A test using it runs in both cases; nothing is skipped.

full_disk_for_new_files(): files created by tempfile.mkstemp write to /dev/full, whose every
write fails with the kernel's real ENOSPC.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """Inside the block `folder` cannot be written; yields how ("chmod" or "EROFS")."""
    if not IS_ROOT:
        with _chmod_read_only(folder):
            yield "chmod"
        return
    mp = pytest.MonkeyPatch()
    try:
        _refuse_writes_inside(folder, mp)
        yield "EROFS"
    finally:
        mp.undo()


@contextlib.contextmanager
def _chmod_read_only(folder: Path) -> Iterator[None]:
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    try:
        for p in reversed(paths):  # contents first, the folder last
            p.chmod(modes[p] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        yield
    finally:
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]))


def _refuse_writes_inside(folder: Path, mp: pytest.MonkeyPatch) -> None:
    root = os.path.realpath(folder)

    def inside(p) -> bool:
        if isinstance(p, int):
            return False
        return os.path.realpath(os.fspath(p)).startswith(root)

    def erofs(p):
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(p))

    def guard(real, *path_args):
        def call(*a, **k):
            for i in path_args:
                if len(a) > i and inside(a[i]):
                    raise erofs(a[i])
            return real(*a, **k)

        return call

    real_open, real_os_open, real_connect = builtins.open, os.open, sqlite3.connect

    def open_(file, mode="r", *a, **k):
        if inside(file) and any(c in mode for c in "wax+"):
            raise erofs(file)
        return real_open(file, mode, *a, **k)

    def os_open(path, flags, *a, **k):
        if inside(path) and flags & _WRITE_FLAGS:
            raise erofs(path)
        return real_os_open(path, flags, *a, **k)

    def connect(database, *a, **k):
        if database != ":memory:" and not k.get("uri") and inside(database):
            return real_connect(f"file:{os.fspath(database)}?mode=ro", *a, uri=True, **k)
        return real_connect(database, *a, **k)

    mp.setattr(builtins, "open", open_)
    mp.setattr(os, "open", os_open)
    mp.setattr(sqlite3, "connect", connect)
    for name, path_args in (
        ("replace", (0, 1)),
        ("rename", (0, 1)),
        ("unlink", (0,)),
        ("remove", (0,)),
        ("mkdir", (0,)),
        ("rmdir", (0,)),
        ("utime", (0,)),
    ):
        mp.setattr(os, name, guard(getattr(os, name), *path_args))


@contextlib.contextmanager
def full_disk_for_new_files() -> Iterator[list[str]]:
    """Inside the block, files made by tempfile.mkstemp are /dev/full underneath (ENOSPC on
    every write); yields the list of their paths."""
    made: list[str] = []
    real = tempfile.mkstemp

    def mkstemp(*a, **k):
        fd, path = real(*a, **k)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        made.append(path)
        return fd, path

    mp = pytest.MonkeyPatch()
    mp.setattr(tempfile, "mkstemp", mkstemp)
    try:
        yield made
    finally:
        mp.undo()
