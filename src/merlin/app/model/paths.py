"""Where Merlin keeps its files: the user data folder (chats, images, settings, saved sessions)
and resources.

`MERLIN_DATA_DIR` overrides the data folder (tests and `--demo-screenshot` use a temporary one,
so they never touch the user's chats).
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_data_path

ENV_DATA_DIR = "MERLIN_DATA_DIR"
APP_NAME = "merlin"


_fallback: dict[str, Path] = {}  # wanted folder -> temporary folder used instead
PROBLEMS: dict[str, str] = {}  # wanted folder -> why it cannot be used


def _data_folder(override: str | None) -> Path:
    """MERLIN_DATA_DIR if set (a ~ expanded), else the platform's user data folder."""
    return (
        Path(os.path.expanduser(override))
        if override
        else user_data_path(APP_NAME, appauthor=False)
    )


def data_dir() -> Path:
    """The folder for chats, stored images and settings (created on first use). When it
    cannot be used (MERLIN_DATA_DIR names a file, a folder that cannot be made...), a
    temporary folder is used for this run and data_dir_problem() says why (the window shows
    it; nothing is saved for the next start)."""
    override = os.environ.get(ENV_DATA_DIR)
    folder = _data_folder(override)
    key = str(folder)
    if key in _fallback:
        return _fallback[key]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not folder.is_dir():
            raise NotADirectoryError(20, "not a folder")
        return folder
    except (OSError, ValueError) as e:
        import sys
        import tempfile

        what = (
            "is a file, not a folder"
            if folder.exists() and not folder.is_dir()
            else (f"cannot be created ({getattr(e, 'strerror', None) or e})")
        )
        temp = Path(tempfile.mkdtemp(prefix="merlin-data-"))
        PROBLEMS[key] = (
            f"The data folder {folder} {what}. Chats and settings are kept in {temp} for this "
            f"run only. Fix it or set {ENV_DATA_DIR} to a folder Merlin can write."
        )
        print(f"merlin: {PROBLEMS[key]}", file=sys.stderr)
        _fallback[key] = temp
        return temp


def data_dir_problem() -> str:
    """Why the data folder in use is a temporary one ("" when it is not)."""
    override = os.environ.get(ENV_DATA_DIR)
    folder = _data_folder(override)
    return PROBLEMS.get(str(folder), "")


def sessions_dir() -> Path:
    """Saved engine sessions (KV caches of conversations): a cache beside the chats, never the
    source of truth; created by the engine when it first saves."""
    return data_dir() / "sessions"


def resources_dir() -> Path:
    """Icons and other files made by the project (src/merlin/resources)."""
    return Path(__file__).resolve().parents[2] / "resources"


def icon_path(name: str) -> Path:
    return resources_dir() / "icons" / f"{name}.svg"
