"""SwiGLU activation."""

import numpy as np
from numba import njit

from . import FASTMATH
from .mathfn import fast_exp


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def silu_mul(gate_up, out):
    """gate_up: [N, 2I] f32 (gate then up), out: [N, I] f32 = silu(gate) * up."""
    n_rows, width = out.shape
    for n in range(n_rows):
        for i in range(width):
            g = gate_up[n, i]
            out[n, i] = g / (np.float32(1.0) + fast_exp(-g)) * gate_up[n, width + i]
