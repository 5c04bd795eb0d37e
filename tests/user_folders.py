"""The guard of tests/conftest.py: the user's real data, config and cache folders are
snapshotted before the run and redirected to temporary folders for it; changes() lists what
was written to the real ones since (tests/robustness/test_user_folders.py checks the guard)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SHARED = ("numba",)  # subfolders of the real cache that tests may write (compiled kernels)
MAX_FILES = 20_000  # a huge real folder is sampled, not walked whole, per test


def _snapshot(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    if not root.is_dir():
        return out
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        for name in files:
            p = here / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p)] = (st.st_size, st.st_mtime_ns)
            if len(out) >= MAX_FILES:
                return out
    return out


class Guard:
    def __init__(self, roots: list[Path], skip: tuple[Path, ...]):
        self.roots, self.skip = roots, skip
        self.rebase()

    def _all(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for r in self.roots:
            out.update(_snapshot(r, self.skip))
        return out

    def rebase(self) -> None:
        self.before = self._all()

    def changes(self) -> list[str]:
        now = self._all()
        changed = [p for p, v in now.items() if self.before.get(p) != v]
        changed += [p for p in self.before if p not in now]
        return sorted(changed)


def install_guard() -> Guard:
    """Snapshot the real folders, then redirect every variable that locates them."""
    from platformdirs import user_cache_path, user_config_path, user_data_path

    real_cache = user_cache_path("merlin")
    roots = [user_data_path("merlin", appauthor=False), user_config_path("merlin"), real_cache]
    if "NUMBA_CACHE_DIR" not in os.environ:  # the kernel cache keeps its real place
        from merlin.engine.version import __version__

        os.environ["NUMBA_CACHE_DIR"] = str(real_cache / "numba" / __version__)
    guard = Guard(roots, tuple(real_cache / s for s in SHARED))
    base = Path(tempfile.mkdtemp(prefix="merlin-test-home-"))
    for var, sub in (
        ("XDG_DATA_HOME", "data"),
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_STATE_HOME", "state"),
    ):
        os.environ[var] = str(base / sub)
    os.environ.setdefault("MERLIN_SESSION_CACHE", str(base / "sessions"))
    os.environ["MERLIN_DATA_DIR"] = str(base / "merlin-data")
    os.environ["HOME"] = str(base / "home")
    (base / "home").mkdir()
    return guard
