"""What this machine can do, measured in the same run as the engine figures: read bandwidth
(best of a NumPy float32 dot and a Numba read-only sum with several accumulators) and BLAS
sgemm GFLOP/s. The host is shared and noisy, so every engine figure is reported as a ratio
against these. Also what /proc/cpuinfo says of the cores (cpuinfo)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from numba import njit, prange

from ..kernels import FASTMATH


def best_time(fn, repeats: int = 3) -> float:
    """Fastest of a few runs (seconds): the least disturbed by other work on the host."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def median_time(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@njit(nogil=True, cache=True, fastmath=FASTMATH, parallel=True)
def read_sum(a, n_chunks=256):
    """Read-only sum of a flat float32 array, chunks in parallel; reassociation lets LLVM
    keep several vector accumulators (interleaved), so the loop is limited by memory, not by
    the add latency."""
    chunk = a.shape[0] // n_chunks
    partial = np.zeros(n_chunks, np.float32)
    for c in prange(n_chunks):
        part = a[c * chunk : (c + 1) * chunk]  # 0-based loop: no negative-index wraparound,
        s = np.float32(0.0)  # so LLVM sees contiguous loads (not gathers)
        for i in range(chunk):
            s += part[i]
        partial[c] = s
    return partial.sum()


def read_bandwidth(gb: float = 2.0) -> dict:
    """GB/s reading `gb` gigabytes once: NumPy dot and a Numba sum (best of 3 each); the
    better is the figure. The one bandwidth probe of every benchmark."""
    n = int(gb * 1e9 / 4) // 1024 * 1024
    a = np.ones(n, np.float32)
    np.dot(a[:1024], a[:1024])
    read_sum(a[: 1024 * 64], 64)
    dot_s = best_time(lambda: np.dot(a, a))
    sum_s = best_time(lambda: read_sum(a))
    out = {"numpy_dot_gbs": a.nbytes / dot_s / 1e9, "numba_sum_gbs": a.nbytes / sum_s / 1e9}
    out["best_gbs"] = max(out.values())
    return out


def sgemm_gflops(m: int = 512, k: int = 2048, n: int = 6144) -> float:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x @ w[:64].T
    return 2 * m * k * n / best_time(lambda: x @ w.T) / 1e9


def cpuinfo(*keys: str) -> str:
    """The value of the first /proc/cpuinfo line whose key is one of keys ('' if none, or no
    such file): "flags" (x86) or "Features" (aarch64), "vendor_id", "model name"..."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in keys:
            return value.strip()
    return ""
