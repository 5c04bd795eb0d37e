"""Shared fixtures. Everything a test needs is made here or shipped in tests/fixtures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# converted weights go to a per-run folder, never to the user's cache
os.environ["MERLIN_WEIGHT_CACHE"] = tempfile.mkdtemp(prefix="merlin-weights-")
os.environ["MERLIN_VISION_SPEED"] = tempfile.mkdtemp(prefix="merlin-vspeed-") + "/speed.json"


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo checkpoint, built by the real builder into a per-run folder."""
    from merlin.engine.demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def demo_model(demo_dir):
    from merlin.engine.model import load_model

    return load_model(demo_dir)
