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


def data_dir() -> Path:
    """The folder for chats, stored images and settings (created on first use)."""
    override = os.environ.get(ENV_DATA_DIR)
    folder = Path(override).expanduser() if override else user_data_path(APP_NAME, appauthor=False)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sessions_dir() -> Path:
    """Saved engine sessions (KV caches of conversations): a cache beside the chats, never the
    source of truth; created by the engine when it first saves."""
    return data_dir() / "sessions"


def resources_dir() -> Path:
    """Icons and other files made by the project (src/merlin/resources)."""
    return Path(__file__).resolve().parents[2] / "resources"


def icon_path(name: str) -> Path:
    return resources_dir() / "icons" / f"{name}.svg"
