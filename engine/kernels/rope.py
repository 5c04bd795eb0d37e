"""Rotary embedding applied in place, half-split (NeoX) convention: dim i pairs with i + HD/2."""

import numpy as np
from numba import njit

from . import FASTMATH


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def apply_rope(x, cos, sin):
    """x: [N, H, HD] f32 (rotated in place), cos/sin: [N, HD/2] f32."""
    n_rows, n_heads, head_dim = x.shape
    half = head_dim // 2
    for n in range(n_rows):
        for h in range(n_heads):
            for i in range(half):
                a = x[n, h, i]
                b = x[n, h, i + half]
                c = cos[n, i]
                s = sin[n, i]
                x[n, h, i] = a * c - b * s
                x[n, h, i + half] = b * c + a * s


@njit(nogil=True, cache=True)
def rope_tables(positions, axis, inv_freq, cos, sin):
    """positions: [3, N] int64, axis: [HD/2] int64 (0=T, 1=H, 2=W), inv_freq: [HD/2] f32;
    cos/sin: [N, HD/2] f32. Angles are f32 products as in transformers; cos/sin are taken in
    f64 element by element (no vector libm), so a row never depends on how many rows there are."""
    n_rows = positions.shape[1]
    for n in range(n_rows):
        for j in range(axis.shape[0]):
            angle = np.float32(np.float32(positions[axis[j], n]) * inv_freq[j])
            cos[n, j] = np.float32(np.cos(np.float64(angle)))
            sin[n, j] = np.float32(np.sin(np.float64(angle)))
