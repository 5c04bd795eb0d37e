"""RMSNorm over the last axis, as Qwen3 computes it: normalise in f32, then scale by the weight."""

import numpy as np
from numba import njit

from . import FASTMATH


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def rmsnorm(x, w, eps, out):
    """x: [R, D] f32, w: [D] f32, out: [R, D] f32 (may be x itself)."""
    n_rows, dim = x.shape
    for r in range(n_rows):
        ss = np.float32(0.0)
        for d in range(dim):
            ss += x[r, d] * x[r, d]
        scale = np.float32(1.0) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
        for d in range(dim):
            out[r, d] = w[d] * (x[r, d] * scale)


def rmsnorm_reference(x, w, eps):
    x64 = x.astype(np.float64)
    return (w * (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps))).astype(np.float32)
