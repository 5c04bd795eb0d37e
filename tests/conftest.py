"""Shared fixtures. Everything a test needs is made here or shipped in tests/fixtures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# converted weights go to a per-run folder, never to the user's cache
os.environ["MERLIN_WEIGHT_CACHE"] = tempfile.mkdtemp(prefix="merlin-weights-")
# `--weights auto` (the default) resolves to q4 without timing the kernels, so that tests do
# not depend on this machine's timings; tests/engine/test_autoweights.py measures for real
os.environ.setdefault("MERLIN_AUTO_WEIGHTS", "q4")


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo checkpoint, built by the real builder into a per-run folder."""
    from merlin.engine.demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def demo_model(demo_dir):
    from merlin.engine.model import load_model

    return load_model(demo_dir)
