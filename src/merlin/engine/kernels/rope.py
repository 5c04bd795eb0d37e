"""Rotary embedding, half-split (NeoX) convention: dim i pairs with i + HD/2."""

import numpy as np
from numba import njit

from . import FASTMATH


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


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def norm_rope_heads(src, col0, w, eps, cos, sin, out):
    """out[n, h] = rope(rmsnorm(head h of row n of src, w)): Qwen3's per-head q/k norm and
    the rotary embedding in one pass, read straight from the fused qkv rows. Head h is
    src[n, col0 + h HD : col0 + (h + 1) HD]; out: [N, H, HD] f32, w: [HD], cos/sin:
    [N, HD/2]. The float operations of rmsnorm, then the rotation; one call instead of two
    copies, two norms and two rotations per layer (a decode step made ~170 such calls)."""
    n_rows, n_heads, head_dim = out.shape
    half = head_dim // 2
    for n in range(n_rows):
        for h in range(n_heads):
            # a slice, indexed from range(): an index col0 + ... that Numba cannot prove
            # non-negative gets a wraparound branch per access, and the loops stayed scalar
            # (28 us for a 5-token verify's queries instead of 3-5)
            x = src[n, col0 + h * head_dim : col0 + (h + 1) * head_dim]
            ss = np.float32(0.0)
            for d in range(head_dim):
                ss += x[d] * x[d]
            scale = np.float32(1.0) / np.sqrt(ss / np.float32(head_dim) + np.float32(eps))
            for i in range(half):
                a = w[i] * (x[i] * scale)
                b = w[i + half] * (x[i + half] * scale)
                c = cos[n, i]
                s = sin[n, i]
                out[n, h, i] = a * c - b * s
                out[n, h, i + half] = b * c + a * s
