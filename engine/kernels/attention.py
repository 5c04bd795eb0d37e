"""Causal GQA attention of N new queries over the KV cache (f32 or int8 with a scale per row).

Parallel over KV heads. A task gathers the M = N x group query vectors that read its head (all
new tokens, all query heads of the group) and passes over the head's K and V once for all of
them, so a speculative verify of N tokens reads the cache once, like a decode step:

  scores  register tiles of up to 4 queries x 64 keys (2 x 32 on NEON), summed over d: each K
          element is loaded and converted once per tile of queries, never once per query.
          K is stored in tiles of 64 keys, [kv_head, capacity / 64, head_dim, 64] (below);
  softmax per query over its own keys (query n sees keys 0..start+n); later keys get p = 0;
  values  register tiles of 4 queries x 64 dimensions (2 x 32 on NEON), summed over keys.

Each score is fma(q[d], k[d, t], acc) for d = 0, 1, ... and each output fma(p[t], v[t, d], acc)
for t = 0, 1, ...: the same float operations whatever the tile, N or thread count (FASTMATH
without "reassoc"; the extra keys a verify sweeps for its earlier queries add fma(0, v, acc),
exactly acc), so verify rows equal decode rows bit for bit.

Key layout. A score tile reads, for each of the head_dim dimensions, 64 consecutive keys. With
K transposed as one [head_dim, capacity] matrix those were 128 rows at a stride of the
capacity: 128 concurrent streams, more than the hardware prefetchers follow, and from DRAM the
K pass took twice as long as the V pass over the same bytes (q8 KV at 26-44% of the read
bandwidth at 2K-8K context). Tiled, a score tile reads one contiguous 8 KB (int8) block and a
head's keys are one sequential stream. Saved caches keep the logical [head_dim, tokens] layout
(untile_keys / tile_keys_into).

Assembly of the hot loops (inspect_asm; aarch64 under qemu-user in the arm64 root of
packaging/test-arm64.sh, NUMBA_CPU_NAME=cortex-a76), int8 cache: x86-64 znver4, per 16 values
vpmovsxbd + vcvtdq2ps once, then one vfmadd231ps per query with the other operand broadcast;
aarch64, per 32 values an ldp, 8 tbl + 8 scvtf #24 (sign extension and conversion), then 8
fmla by element per query; both keep all 16 accumulators in registers.

An f32 cache passes all-ones scales; multiplying by 1.0 is exact, so the f32 path loses
nothing by sharing this kernel.
"""

import numpy as np
from numba import carray, njit, prange

from . import FASTMATH
from .mathfn import fast_exp
from .qlinear import _X86, stack_f32

AFASTMATH = FASTMATH - {"reassoc"}
KEY_BLOCK = 64  # keys per stored K tile
# Register tiles of 16 accumulator registers: queries x keys for scores, queries x dimensions
# for values. AVX-512 (32 registers of 16 floats): 4 x 64. NEON (32 registers of 4 floats):
# 2 x 32; a 4 x 64 tile there kept its accumulators on the stack (ldr/fmla/str per product in
# the cortex-a76 assembly).
SCORE_QUERIES, SCORE_KEYS = (4, 64) if _X86 else (2, 32)
VALUE_QUERIES, DIM_BLOCK = (4, 64) if _X86 else (2, 32)
SCORE_FLOATS = SCORE_QUERIES * SCORE_KEYS
VALUE_FLOATS = VALUE_QUERIES * DIM_BLOCK


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_tile(qm, m0, mr, k_head, t0, width, scores):
    """scores[m0 + m, t0 + u] = sum_d qm[m0 + m, d] * key t0 + u, dimension d, for m < mr (a
    constant after inlining), u < width (SCORE_KEYS, or the tail); t0 is a multiple of
    SCORE_KEYS, so the keys lie in one stored tile, k_head[t0 // KEY_BLOCK]: [head_dim, 64]."""
    acc = carray(stack_f32(SCORE_FLOATS), SCORE_FLOATS)
    for i in range(mr * SCORE_KEYS):
        acc[i] = 0.0
    tile = k_head[t0 // KEY_BLOCK]
    u0 = t0 % KEY_BLOCK
    for d in range(tile.shape[0]):
        row = tile[d]
        for u in range(width):
            kf = np.float32(row[u0 + u])
            for m in range(mr):
                acc[m * SCORE_KEYS + u] += qm[m0 + m, d] * kf
    for m in range(mr):
        for u in range(width):
            scores[m0 + m, t0 + u] = acc[m * SCORE_KEYS + u]


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_rows(qm, m0, mr, k_head, n_max, scores):
    full = n_max // SCORE_KEYS * SCORE_KEYS
    for t0 in range(0, full, SCORE_KEYS):
        _score_tile(qm, m0, mr, k_head, t0, SCORE_KEYS, scores)
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
def attention(q, k_tiles, k_scale, v, v_scale, start, scale, out):
    """q: [N, NH, HD] f32; k_tiles: [NKV, cap / 64, HD, 64] (keys in tiles of 64), v: [NKV,
    cap, HD], f32 or int8, holding cache indexes 0..start+N-1; k_scale, v_scale: [NKV, cap]
    f32 (row scales; ones for f32). Query n sits at cache index start + n and sees keys
    0..start+n. out: [N, NH * HD] f32."""
    n_rows, n_heads, head_dim = q.shape
    n_kv = k_tiles.shape[0]
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
        k_head = k_tiles[g]
        m0 = 0
        while m0 + SCORE_QUERIES <= n_q:
            _score_rows(qm, m0, SCORE_QUERIES, k_head, n_max, scores)
            m0 += SCORE_QUERIES
        rest = n_q - m0
        if rest == 3 and SCORE_QUERIES > 3:
            _score_rows(qm, m0, 3, k_head, n_max, scores)
        elif rest == 2 and SCORE_QUERIES > 2:
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
        if rest == 3 and VALUE_QUERIES > 3:
            _value_rows(scores, m0, 3, v_head, n_max, out_rows)
        elif rest == 2 and VALUE_QUERIES > 2:
            _value_rows(scores, m0, 2, v_head, n_max, out_rows)
        elif rest == 1:
            _value_rows(scores, m0, 1, v_head, n_max, out_rows)
        for m in range(n_q):
            n = m // group
            h = h0 + m % group
            for d in range(head_dim):
                out[n, h * head_dim + d] = out_rows[m, d]


def attention_reference(q, k_tiles, k_scale, v, v_scale, start, scale):
    """Naive float64 twin of attention()."""
    n_rows, n_heads, head_dim = q.shape
    group = n_heads // k_tiles.shape[0]
    k_t = untile_keys(k_tiles, v.shape[1])
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


def key_tiles(capacity: int) -> int:
    """Stored K tiles for a capacity of that many tokens."""
    return -(-capacity // KEY_BLOCK)


def untile_keys(k_tiles: np.ndarray, n: int) -> np.ndarray:
    """Keys 0..n-1 of [..., tiles, HD, 64] in the logical layout [..., HD, n] (a copy)."""
    t = key_tiles(n)
    flat = np.swapaxes(k_tiles[..., :t, :, :], -3, -2)  # [..., HD, t, 64]
    return flat.reshape(*flat.shape[:-2], t * KEY_BLOCK)[..., :n]


def tile_keys_into(k_tiles: np.ndarray, keys: np.ndarray) -> None:
    """Store logical keys [..., HD, n] as keys 0..n-1 of k_tiles [..., tiles, HD, 64]."""
    n = keys.shape[-1]
    full, rest = divmod(n, KEY_BLOCK)
    head = keys[..., : full * KEY_BLOCK].reshape(*keys.shape[:-1], full, KEY_BLOCK)
    k_tiles[..., :full, :, :] = np.swapaxes(head, -3, -2)
    if rest:
        k_tiles[..., full, :, :rest] = keys[..., full * KEY_BLOCK :]


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _row_factor(x, n, g, scales, pos, quantized):
    """What row (n, g) of x is multiplied by before it is stored: 1 for an f32 cache; for an
    int8 one, 1 / its symmetric scale max|x| / 127, which goes to scales[g, pos]."""
    if not quantized:
        return np.float32(1.0)
    amax = np.float32(0.0)
    for d in range(x.shape[2]):
        amax = max(amax, abs(x[n, g, d]))
    sc = amax / np.float32(127.0)
    scales[g, pos] = sc
    return np.float32(0.0) if sc == 0 else np.float32(1.0) / sc


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def store_rows(x, dest, scales, start):
    """x: [N, NKV, HD] f32 -> cache index t = start + n of every head at dest[g, t // B, d,
    t % B], B = dest.shape[3]: keys in tiles of 64 (dest = the K tiles), values row by row
    (dest = V[..., None], B = 1). An int8 cache gets one symmetric scale per (token, head)
    row in scales[g, t]; an f32 one gets the values (its scales stay ones)."""
    quantized = dest.itemsize == 1
    block = dest.shape[3]
    for n in range(x.shape[0]):
        t = start + n
        for g in range(x.shape[1]):
            f = _row_factor(x, n, g, scales, t, quantized)
            for d in range(x.shape[2]):
                value = x[n, g, d] * f
                dest[g, t // block, d, t % block] = np.rint(value) if quantized else value
