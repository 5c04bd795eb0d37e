"""Weight matrix products for f32 weights: a small-N kernel for decode/verify, BLAS for prefill.

`matmul_f32` reads each weight row once for all N activation rows (N = 1 decode, N = K+1
verify), and each output element is one dot product whose order does not depend on N.
"""

import numpy as np
from numba import njit, prange

from . import FASTMATH

ROWS_PER_TASK = 8  # output rows per parallel task: enough work to amortise scheduling


@njit(nogil=True, cache=True, fastmath=FASTMATH, parallel=True)
def matmul_f32(x, w, out):
    """out[n, o] = sum_k x[n, k] * w[o, k].   x: [N, K] f32, w: [O, K] f32, out: [N, O] f32."""
    n_rows, k_dim = x.shape
    n_out = w.shape[0]
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(n_tasks):
        o_end = min(n_out, (task + 1) * ROWS_PER_TASK)
        for o in range(task * ROWS_PER_TASK, o_end):
            for n in range(n_rows):
                acc = np.float32(0.0)
                for k in range(k_dim):
                    acc += x[n, k] * w[o, k]
                out[n, o] = acc


def matmul_f32_reference(x, w):
    """Naive twin of matmul_f32 (float64 accumulation) for tests."""
    return (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
