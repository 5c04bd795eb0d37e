"""Kernel thread count, settable at run time from the engine's own thread."""

from __future__ import annotations

import numba

from .errors import InputError


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


def set_threads(n: int | None) -> int:
    """Use n kernel threads (None: all available). Returns the count in use."""
    limit = max_threads()
    if n is None:
        n = limit
    if n < 1:
        raise InputError(f"threads must be at least 1, got {n}.")
    numba.set_num_threads(min(n, limit))
    return numba.get_num_threads()
