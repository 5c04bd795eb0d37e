"""Kernel thread count, settable at run time from the engine's own thread."""

from __future__ import annotations

import contextlib
import os

import numba

from .errors import InputError


def max_threads() -> int:
    return numba.config.NUMBA_NUM_THREADS


def default_threads() -> int:
    """One kernel thread per CPU this process may run on (engine.cpu pins it to the big cores
    of a big.LITTLE CPU by default), at most Numba's pool size."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = max_threads()
    return max(1, min(n, max_threads()))


def set_threads(n: int | None) -> int:
    """Use n kernel threads (None: one per CPU the process may run on). Returns the count."""
    limit = max_threads()
    if n is None:
        n = default_threads()
    if n < 1:
        raise InputError(f"threads must be at least 1, got {n}.")
    numba.set_num_threads(min(n, limit))
    return numba.get_num_threads()


@contextlib.contextmanager
def one_thread():
    """The kernels run on the calling thread alone inside this block (the count is the
    calling thread's own, so other engine threads keep theirs). For work too small to pay
    for waking the pool: see text.SERIAL_WORK_BYTES."""
    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(saved)
