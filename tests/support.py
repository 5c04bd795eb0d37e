"""Helpers shared by test files in several folders.

tests/ is on sys.path (pyproject.toml, pythonpath), so any test module imports this by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from merlin.engine.checkpoint import Checkpoint
from merlin.engine.config import load_config
from merlin.engine.text import TextModel, load_text_weights

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_DIRS = sorted(p for p in FIXTURES.glob("ref_*") if (p / "reference.npz").is_file())


def load_text_model(folder):
    """The text decoder of a checkpoint folder in f32, without the vision tower."""
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt:
        weights = load_text_weights(ckpt, cfg)
    return TextModel(cfg.text, weights)


def run_cli(*args, env_extra=None, timeout=300):
    """`merlin-cli ARGS` in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "merlin.engine.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_user_error(result, *fragments):
    """A clear message with each fragment, a non-zero exit and no traceback."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    for f in fragments:
        assert f in result.stderr, result.stderr
