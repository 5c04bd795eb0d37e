"""The guard of tests/conftest.py: nothing a test runs may write into the user's real data,
config or cache folders.

1. Before any Merlin module is imported, every variable that locates those folders (HOME,
   XDG_*, MERLIN_DATA_DIR, MERLIN_SESSION_CACHE) points at a per-run temporary folder, so
   code that follows the variables (and every child process: the app started by a test) writes
   there.
2. An audit hook (sys.addaudithook) sees every file this process opens for writing, creates,
   renames, deletes, and every SQLite database it connects to; one inside a real folder is
   recorded, and the autouse fixture in conftest.py fails the test that did it. The hook is
   per process on purpose: other programs (another test run on the same machine) writing to
   the same folders are not this run's fault and are not reported.

The one shared folder is the compiled-kernel cache (numba/ under the user's cache): kernels
take minutes to compile and hold no user data, so it keeps its real location.
tests/robustness/test_user_folders.py checks the guard itself.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

SHARED = ("numba",)  # subfolders of the real cache that tests may write (compiled kernels)
_EVENTS = frozenset(
    [
        "open",
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "os.truncate",
        "shutil.rmtree",
        "os.rename",
        "os.replace",
        "os.link",
        "os.symlink",
        "sqlite3.connect",
    ]
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Guard:
    def __init__(self, roots: list[Path], shared: list[Path]):
        self.roots = [str(r.resolve()) + os.sep for r in roots]
        self.shared = [str(s.resolve()) + os.sep for s in shared]
        self.writes: list[str] = []

    def inside(self, path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            p = os.path.abspath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        p_dir = p + os.sep
        if any(p_dir.startswith(s) for s in self.shared):
            return False
        return any(p_dir.startswith(r) for r in self.roots)

    def hook(self, event: str, args) -> None:
        if event not in _EVENTS:  # cheap for the thousands of other events
            return
        try:
            if event == "open":
                path, mode, flags = args
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & _WRITE_FLAGS
                )
                if writing and self.inside(path):
                    self.writes.append(f"{event} {path}")
            elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.truncate", "shutil.rmtree"):
                if self.inside(args[0]):
                    self.writes.append(f"{event} {args[0]}")
            elif event in ("os.rename", "os.replace", "os.link", "os.symlink"):
                if self.inside(args[0]) or self.inside(args[1]):
                    self.writes.append(f"{event} {args[1]}")
            elif event == "sqlite3.connect":
                if self.inside(args[0]):
                    self.writes.append(f"{event} {args[0]}")
        except Exception:  # an audit hook must never break the code it watches
            pass

    def changes(self) -> list[str]:
        return list(self.writes)

    def rebase(self) -> None:
        self.writes.clear()


def real_folders() -> tuple[list[Path], Path]:
    from platformdirs import user_cache_path, user_config_path, user_data_path

    cache = user_cache_path("merlin")
    return [user_data_path("merlin", appauthor=False), user_config_path("merlin"), cache], cache


def install_guard() -> Guard:
    """Redirect every variable that locates the user's folders; watch this process's writes."""
    roots, real_cache = real_folders()
    if "NUMBA_CACHE_DIR" not in os.environ:  # the kernel cache keeps its real place
        from merlin.engine.version import __version__

        os.environ["NUMBA_CACHE_DIR"] = str(real_cache / "numba" / __version__)
        # made now, before the guard watches: on a new machine its parents do not exist yet
        Path(os.environ["NUMBA_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    guard = Guard(roots, [real_cache / s for s in SHARED])
    base = Path(tempfile.mkdtemp(prefix="merlin-test-home-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
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
    sys.addaudithook(guard.hook)
    return guard
