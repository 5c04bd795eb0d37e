"""SwiGLU activation."""

import numpy as np
from numba import njit

from . import FASTMATH
from .mathfn import fast_exp


@njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def silu_mul(gate_up, out):
    """gate_up: [N, 2I] f32 (gate then up), out: [N, I] f32 = silu(gate) * up.

    error_model="numpy": Numba's default checks every float division for a zero divisor
    (to raise ZeroDivisionError), and that branch kept this loop scalar: 5.4 ns a value,
    5 ms of a 5-token verify step of the 2B model (28 x 5 x 6144 values). Without it the
    loop vectorises (0.5 ns a value, the same bits); 1 + exp(-g) >= 1 is never zero."""
    n_rows, width = out.shape
    for n in range(n_rows):
        # the up half as a slice: an index width + i that Numba cannot prove non-negative
        # gets a wraparound branch per access
        gate, up, row = gate_up[n, :width], gate_up[n, width:], out[n]
        for i in range(width):
            g = gate[i]
            row[i] = g / (np.float32(1.0) + fast_exp(-g)) * up[i]
