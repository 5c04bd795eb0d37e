"""The clock probe of the board section: a chain of dependent one-cycle integer operations
(x = (x + A) ^ B: an add and an xor a step, no register moves, which some cores eliminate and
others do not). llvm-mca gives the chain's cycles per step for this host's core; timing it
alongside each kernel timing gives the clock that kernel actually ran at (a KVM guest reports
only its TSC rate, and on a shared host the time slices change from second to second)."""

import time

import numpy as np
from numba import njit

_A, _B = np.uint64(0x9E3779B97F4A7C15), np.uint64(0x5555555555555555)
STEPS = 2_000_000


@njit(nogil=True, cache=True)
def chain(x, n):
    """n dependent steps x = (x + A) ^ B."""
    for _ in range(n):
        x = (x + _A) ^ _B
    return x


def seconds_per_step(n: int = STEPS) -> float:
    """One timing of chain(., n), per step."""
    t0 = time.perf_counter()
    chain(np.uint64(1), n)
    return (time.perf_counter() - t0) / n
