"""Causal GQA attention of N new queries over the KV cache (f32 or int8 with a scale per row).

Parallel over KV heads. A task gathers the M = N x group query vectors that read its head (all
new tokens, all query heads of the group) and passes over the head's K and V once for all of
them, so a speculative verify of N tokens reads the cache once, like a decode step:

  scores  register tiles of up to 4 queries x 64 keys, summed over d (the K rows are stored
          transposed, [head_dim, capacity], so a tile row is 64 consecutive keys): each K
          element is loaded and converted once per 4 queries, never once per query;
  softmax per query over its own keys (query n sees keys 0..start+n); later keys get p = 0;
  values  register tiles of VALUE_QUERIES queries x 64 dimensions, summed over keys.

Each score is fma(q[d], k[d, t], acc) for d = 0, 1, ... and each output fma(p[t], v[t, d], acc)
for t = 0, 1, ...: the same float operations whatever the tile, N or thread count (FASTMATH
without "reassoc"; the extra keys a verify sweeps for its earlier queries add fma(0, v, acc),
exactly acc), so verify rows equal decode rows bit for bit.

An f32 cache passes all-ones scales; multiplying by 1.0 is exact, so the f32 path loses
nothing by sharing this kernel.
"""

import numpy as np
from numba import carray, njit, prange

from . import FASTMATH
from .mathfn import fast_exp
from .qlinear import _X86, stack_f32

AFASTMATH = FASTMATH - {"reassoc"}
KEY_BLOCK = 64  # keys per score tile
SCORE_QUERIES = 4  # queries per score tile: 4 x 64 lanes = 16 AVX-512 or NEON... registers
DIM_BLOCK = 64  # dimensions per value tile
# queries per value tile: 4 x 64 lanes is 16 zmm registers; NEON (4 lanes) holds one query's 64
VALUE_QUERIES = 4 if _X86 else 1
SCORE_FLOATS = SCORE_QUERIES * KEY_BLOCK
VALUE_FLOATS = VALUE_QUERIES * DIM_BLOCK


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_tile(qm, m0, mr, k_head, t0, width, scores):
    """scores[m0 + m, t0 + u] = sum_d qm[m0 + m, d] * k_head[d, t0 + u] for m < mr (a
    constant after inlining), u < width (KEY_BLOCK, or the tail)."""
    acc = carray(stack_f32(SCORE_FLOATS), SCORE_FLOATS)
    for i in range(mr * KEY_BLOCK):
        acc[i] = 0.0
    for d in range(k_head.shape[0]):
        row = k_head[d]
        for u in range(width):
            kf = np.float32(row[t0 + u])
            for m in range(mr):
                acc[m * KEY_BLOCK + u] += qm[m0 + m, d] * kf
    for m in range(mr):
        for u in range(width):
            scores[m0 + m, t0 + u] = acc[m * KEY_BLOCK + u]


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_rows(qm, m0, mr, k_head, n_max, scores):
    full = n_max // KEY_BLOCK * KEY_BLOCK
    for t0 in range(0, full, KEY_BLOCK):
        _score_tile(qm, m0, mr, k_head, t0, KEY_BLOCK, scores)
    if full < n_max:
        _score_tile(qm, m0, mr, k_head, full, n_max - full, scores)


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _value_tile(scores, m0, mr, v_head, n_max, d0, width, out_rows):
    """out_rows[m0 + m, d0 + u] = sum_t scores[m0 + m, t] * v_head[t, d0 + u]."""
    acc = carray(stack_f32(VALUE_FLOATS), VALUE_FLOATS)
    for i in range(mr * DIM_BLOCK):
        acc[i] = 0.0
    for t in range(n_max):
        row = v_head[t]
        for u in range(width):
            vf = np.float32(row[d0 + u])
            for m in range(mr):
                acc[m * DIM_BLOCK + u] += scores[m0 + m, t] * vf
    for m in range(mr):
        for u in range(width):
            out_rows[m0 + m, d0 + u] = acc[m * DIM_BLOCK + u]


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _value_rows(scores, m0, mr, v_head, n_max, out_rows):
    head_dim = v_head.shape[1]
    full = head_dim // DIM_BLOCK * DIM_BLOCK
    for d0 in range(0, full, DIM_BLOCK):
        _value_tile(scores, m0, mr, v_head, n_max, d0, DIM_BLOCK, out_rows)
    if full < head_dim:
        _value_tile(scores, m0, mr, v_head, n_max, full, head_dim - full, out_rows)


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def _softmax_row(sc, n_keys, k_scale, v_scale, scale):
    """sc[:n_keys] = softmax(sc * k_scale * scale) * v_scale; sc[n_keys:] = 0. Reassociation
    is allowed here (vectorised max, exp and sum: without it this took as long as both
    matrix passes); the order depends only on n_keys, which a query has in decode and in
    verify alike."""
    best = np.float32(-3.0e38)
    for t in range(n_keys):
        sc[t] *= k_scale[t] * scale
        best = max(best, sc[t])
    for t in range(n_keys):
        sc[t] = fast_exp(sc[t] - best)
    total = np.float32(0.0)
    for t in range(n_keys):
        total += sc[t]
    inv = np.float32(1.0) / total
    for t in range(n_keys):
        sc[t] *= inv * v_scale[t]
    for t in range(n_keys, sc.shape[0]):
        sc[t] = 0.0


@njit(nogil=True, cache=True, fastmath=AFASTMATH, parallel=True)
def attention(q, k_t, k_scale, v, v_scale, start, scale, out):
    """q: [N, NH, HD] f32; k_t: [NKV, HD, cap] (keys stored transposed), v: [NKV, cap, HD],
    f32 or int8, holding cache indexes 0..start+N-1; k_scale, v_scale: [NKV, cap] f32 (row
    scales; ones for f32). Query n sits at cache index start + n and sees keys 0..start+n.
    out: [N, NH * HD] f32."""
    n_rows, n_heads, head_dim = q.shape
    n_kv = k_t.shape[0]
    group = n_heads // n_kv
    n_max = start + n_rows
    n_q = n_rows * group
    for g in prange(n_kv):
        h0 = g * group
        qm = np.empty((n_q, head_dim), np.float32)  # query m = (token m // group, head m % group)
        for m in range(n_q):
            for d in range(head_dim):
                qm[m, d] = q[m // group, h0 + m % group, d]
        scores = np.empty((n_q, n_max), np.float32)
        k_head = k_t[g]
        m0 = 0
        while m0 + SCORE_QUERIES <= n_q:
            _score_rows(qm, m0, SCORE_QUERIES, k_head, n_max, scores)
            m0 += SCORE_QUERIES
        rest = n_q - m0
        if rest == 3:
            _score_rows(qm, m0, 3, k_head, n_max, scores)
        elif rest == 2:
            _score_rows(qm, m0, 2, k_head, n_max, scores)
        elif rest == 1:
            _score_rows(qm, m0, 1, k_head, n_max, scores)
        for m in range(n_q):
            _softmax_row(scores[m], start + m // group + 1, k_scale[g], v_scale[g], scale)
        out_rows = np.empty((n_q, head_dim), np.float32)
        v_head = v[g]
        m0 = 0
        while m0 + VALUE_QUERIES <= n_q:
            _value_rows(scores, m0, VALUE_QUERIES, v_head, n_max, out_rows)
            m0 += VALUE_QUERIES
        rest = n_q - m0
        if rest == 3:
            _value_rows(scores, m0, 3, v_head, n_max, out_rows)
        elif rest == 2:
            _value_rows(scores, m0, 2, v_head, n_max, out_rows)
        elif rest == 1:
            _value_rows(scores, m0, 1, v_head, n_max, out_rows)
        for m in range(n_q):
            n = m // group
            h = h0 + m % group
            for d in range(head_dim):
                out[n, h * head_dim + d] = out_rows[m, d]


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
