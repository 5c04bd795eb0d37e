"""Shared by the robustness tests."""

import tracemalloc

import pytest


@pytest.fixture(scope="module", autouse=True)
def _stop_memory_tracing():
    """Stop tracemalloc once a module that started it (fuzzutil.traced) is done."""
    yield
    if tracemalloc.is_tracing():
        tracemalloc.stop()
