"""An exclusive advisory lock (flock) held by an open file: how a window says "I am still
running" to other Merlins on the same data folder (drafts, imports in progress). The lock
goes with the process: a window that crashed or lost power holds none."""

from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: nothing is locked (one Merlin a folder)
    fcntl = None


def try_lock(path: Path):
    """An open file holding an exclusive lock on path (created if missing), or None if
    another process holds it. Close the file to let go. On a file system without locks
    (NFS without its lock daemon, some FUSE mounts) the file comes back unlocked, as where
    fcntl is missing: each Merlin then takes itself for the only one."""
    for _ in range(3):
        f = open(path, "a")  # noqa: SIM115 (held as long as the caller runs)
        if fcntl is None:
            return f
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None  # held by another
            return open(path, "a")  # noqa: SIM115 (no locks here)
        try:  # its holder may have removed the file between our open and our lock
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                return f
        except FileNotFoundError:
            pass
        f.close()  # a lock on a file no longer at path: try the one there now
    return None


def share_running(path: Path):
    """(an open file holding a shared lock on path for as long as this Merlin runs, whether
    no other Merlin held one when it was taken). Alone, what another Merlin left half done
    (an answer marked streaming) is known to be dead; not alone, it may still be going on.
    (Two Merlins starting at the same moment may both find themselves alone: neither has an
    answer streaming yet.) Close the file (None: a file system without shared locks) to let
    go."""
    f = open(path, "a+")  # noqa: SIM115 (readable: NFS emulates a shared flock by a read lock)
    if fcntl is None:
        return f, True
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        alone = True
    except OSError:
        alone = False
    try:  # an exclusive lock converts; else this waits while another Merlin holds its
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # exclusive one (the moment it starts)
    except OSError:  # a file system without shared locks: none held, alone as found
        f.close()
        return None, alone
    return f, alone
