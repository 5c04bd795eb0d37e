"""Replacing a file the user named, atomically, as if it had been written in place.

An atomic save writes a temporary file beside the target and renames it over the target. Done
naively that rename (a) replaces a symlink by a regular file, leaving the file it pointed to
stale, and (b) gives the file the temporary's permissions, so a private (0600) chat becomes
readable by everyone. `target` follows the link first, so the temporary goes beside the real
file (a rename within one folder) and the link stays; `keep_permissions` copies the permission
bits of the file being replaced onto the temporary before the rename.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def target(path: Path | str) -> Path:
    """The file a save to `path` replaces: the end of its symlinks if it is one (a dangling
    link's target is created), else path itself."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def keep_permissions(tmp: Path | str, replaced: Path | str) -> None:
    """Give `tmp` the permission bits of `replaced` if that file exists (a new file keeps the
    ones it was created with)."""
    try:
        mode = stat.S_IMODE(os.stat(replaced).st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)
