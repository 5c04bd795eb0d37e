"""A hash of weight files that tells two checkpoints apart without reading them whole.

Names, sizes and modification times alone do not: a fine-tune of the same base model (a merged
LoRA: same config.json, same tensor shapes, so the same file sizes) copied with `cp -p`, `rsync
-a` or `tar` keeps the times too. So each file adds its first and last MiB and SAMPLES pieces
of 64 KiB spread evenly between: a few MiB read per file, and a fine-tune differs in almost
every piece. `digest` is used by the weight cache's key at load (weight_cache.py) and by saved
sessions' fingerprint (session/persistence.py), and remembered per file path, size and time, so
the files are read once a process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

SAMPLES = 32
_MIB, _PIECE = 1 << 20, 1 << 16
_DIGESTS: dict[tuple, str] = {}  # digest's memo: (path, size, time) of each file -> hex


def digest(paths: Iterable[Path]) -> str:
    """sha256 (hex) of `update` over the files in the order given."""
    paths = list(paths)
    key = tuple(_identity(p) for p in paths)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        update(h, paths)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _identity(p: Path) -> tuple:
    try:
        st = p.stat()
    except OSError:
        return (str(p), None)
    return (str(p), st.st_size, st.st_mtime_ns)


def update(h, paths: Iterable[Path]) -> None:
    """Feed each file of `paths`, in the order given, into the hash object h (hashlib's): its
    name, size and time, then its sampled bytes; a file that cannot be read adds its name."""
    for p in paths:
        try:
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns};".encode())
            with open(p, "rb") as f:
                h.update(f.read(_MIB))
                for i in range(1, SAMPLES + 1):
                    f.seek(st.st_size * i // (SAMPLES + 1))
                    h.update(f.read(_PIECE))
                f.seek(max(0, st.st_size - _MIB))
                h.update(f.read(_MIB))
        except OSError:
            h.update(f"{p.name}: unreadable;".encode())
