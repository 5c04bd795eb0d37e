"""Causal GQA attention of N new queries over the KV cache (f32 or int8 with a scale per row).

Parallel over KV heads: each task reads its head's K and V rows once and serves all query
heads of its group, so decode at long context streams the cache at memory speed. The work for
one query row is the same code whatever N is (no reduction crosses query rows or threads), so
verify rows equal decode rows bit for bit.

An f32 cache passes all-ones scales; multiplying by 1.0 is exact, so the f32 path loses
nothing by sharing this kernel.
"""

import numpy as np
from numba import njit, prange

from . import FASTMATH
from .mathfn import fast_exp


@njit(nogil=True, cache=True, fastmath=FASTMATH, parallel=True)
def attention(q, k_t, k_scale, v, v_scale, start, scale, out):
    """q: [N, NH, HD] f32; k_t: [NKV, HD, cap] (keys stored transposed), v: [NKV, cap, HD],
    f32 or int8, holding cache indexes 0..start+N-1; k_scale, v_scale: [NKV, cap] f32 (row
    scales; ones for f32). Query n sits at cache index start + n and sees keys 0..start+n.
    out: [N, NH * HD] f32.

    Scores are accumulated over d across all keys at once (vectorised over keys, no
    horizontal sum per key); values are accumulated over keys, vectorised over d."""
    n_rows, n_heads, head_dim = q.shape
    n_kv = k_t.shape[0]
    group = n_heads // n_kv
    n_max = start + n_rows
    for g in prange(n_kv):
        scores = np.empty((group, n_max), np.float32)
        acc = np.empty((group, head_dim), np.float32)
        h0 = g * group
        for n in range(n_rows):
            n_keys = start + n + 1
            for j in range(group):
                sc = scores[j]
                sc[:n_keys] = 0.0
                for d in range(head_dim):
                    qd = q[n, h0 + j, d]
                    kd = k_t[g, d]
                    for t in range(n_keys):
                        sc[t] += qd * kd[t]
                best = np.float32(-3.0e38)
                for t in range(n_keys):
                    sc[t] *= k_scale[g, t] * scale
                    best = max(best, sc[t])
                total = np.float32(0.0)
                for t in range(n_keys):
                    e = fast_exp(sc[t] - best)
                    sc[t] = e
                    total += e
                inv = np.float32(1.0) / total
                for t in range(n_keys):
                    sc[t] *= inv * v_scale[g, t]
            acc[:, :] = 0.0
            for t in range(n_keys):
                vt = v[g, t]
                for j in range(group):
                    p = scores[j, t]
                    for d in range(head_dim):
                        acc[j, d] += p * vt[d]
            for j in range(group):
                for d in range(head_dim):
                    out[n, (h0 + j) * head_dim + d] = acc[j, d]


def attention_reference(q, k_t, k_scale, v, v_scale, start, scale):
    """Naive float64 twin of attention()."""
    n_rows, n_heads, head_dim = q.shape
    group = n_heads // k_t.shape[0]
    kf = k_t.transpose(0, 2, 1).astype(np.float64) * k_scale[..., None]
    vf = v.astype(np.float64) * v_scale[..., None]
    out = np.zeros((n_rows, n_heads * head_dim))
    for n in range(n_rows):
        for h in range(n_heads):
            keys = kf[h // group, : start + n + 1]
            s = keys @ q[n, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            out[n, h * head_dim : (h + 1) * head_dim] = p @ vf[h // group, : start + n + 1]
    return out.astype(np.float32)


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def quantize_rows_q8(x, q, s, start, transposed):
    """x: [N, NKV, HD] f32 -> q[g, start + n, :] int8 (or q[g, :, start + n] when transposed)
    and s[g, start + n] f32 with one symmetric scale per (token, head) row: s = max|x| / 127."""
    n_rows, n_kv, head_dim = x.shape
    for n in range(n_rows):
        for g in range(n_kv):
            amax = np.float32(0.0)
            for d in range(head_dim):
                amax = max(amax, abs(x[n, g, d]))
            sc = amax / np.float32(127.0)
            inv = np.float32(0.0) if sc == 0 else np.float32(1.0) / sc
            for d in range(head_dim):
                value = np.int8(np.rint(x[n, g, d] * inv))
                if transposed:
                    q[g, d, start + n] = value
                else:
                    q[g, start + n, d] = value
            s[g, start + n] = sc
