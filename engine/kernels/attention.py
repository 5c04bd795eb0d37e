"""Causal GQA attention of N new queries over an f32 KV cache, parallel over (query, head).

Each (query, head) pair is computed by the same code whatever N is, so verify rows equal
decode rows bit for bit.
"""

import numpy as np
from numba import njit, prange

from . import FASTMATH


@njit(nogil=True, cache=True, fastmath=FASTMATH, parallel=True)
def attention_f32(q, k_cache, v_cache, start, scale, out):
    """q: [N, NH, HD] f32; k_cache, v_cache: [NKV, cap, HD] f32 holding positions
    0..start+N-1; query n sits at cache index start + n and sees keys 0..start+n.
    out: [N, NH * HD] f32."""
    n_rows, n_heads, head_dim = q.shape
    group = n_heads // k_cache.shape[0]
    for job in prange(n_rows * n_heads):
        n = job // n_heads
        h = job - n * n_heads
        g = h // group
        n_keys = start + n + 1
        scores = np.empty(n_keys, np.float32)
        best = np.float32(-3.0e38)
        for t in range(n_keys):
            s = np.float32(0.0)
            for d in range(head_dim):
                s += q[n, h, d] * k_cache[g, t, d]
            s *= scale
            scores[t] = s
            best = max(best, s)
        total = np.float32(0.0)
        for t in range(n_keys):
            e = np.exp(scores[t] - best)
            scores[t] = e
            total += e
        inv = np.float32(1.0) / total
        acc = np.zeros(head_dim, np.float32)
        for t in range(n_keys):
            p = scores[t] * inv
            for d in range(head_dim):
                acc[d] += p * v_cache[g, t, d]
        for d in range(head_dim):
            out[n, h * head_dim + d] = acc[d]


def attention_reference(q, k_cache, v_cache, start, scale):
    """Naive float64 twin of attention_f32."""
    n_rows, n_heads, head_dim = q.shape
    group = n_heads // k_cache.shape[0]
    out = np.zeros((n_rows, n_heads * head_dim))
    for n in range(n_rows):
        for h in range(n_heads):
            keys = k_cache[h // group, : start + n + 1].astype(np.float64)
            s = keys @ q[n, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            out[n, h * head_dim : (h + 1) * head_dim] = p @ v_cache[h // group, : start + n + 1]
    return out.astype(np.float32)
