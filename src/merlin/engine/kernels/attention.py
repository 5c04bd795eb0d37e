"""Causal GQA attention of N new queries over the KV cache (f32 or int8 with a scale per row).

Parallel over KV heads. A task gathers the M = N x group query vectors that read its head (all
new tokens, all query heads of the group) and passes over the head's K and V once for all of
them, so a speculative verify of N tokens reads the cache once, like a decode step:

  scores  register tiles of up to 4 queries x 64 keys (2 x 32 on NEON), summed over d: each K
          element is loaded (and converted) once per tile of queries, never once per query.
          K is stored in tiles of 64 keys (below);
  softmax per query over its own keys (query n sees keys 0..start+n); later keys get p = 0;
  values  register tiles of 4 queries x 64 dimensions (2 x 32 on NEON), summed over keys; up
          to half as many queries (a decode step's pair of query heads) take twice the
          dimensions, so each V row is read in one pass.

Both passes prefetch KV_PREFETCH bytes ahead in software (figures: docs/kernels.md).

f32 cache: each score is fma(q[d], k[d, t], acc) for d = 0, 1, ... and each output
fma(p[t], v[t, d], acc) for t = 0, 1, ...: the same float operations whatever the tile, N or
thread count (FASTMATH without "reassoc"; the extra keys a verify sweeps for its earlier queries
add fma(0, v, acc), exactly acc), so verify rows equal decode rows bit for bit.

int8 cache: integer dot products, as the q8 weights do (qgroup.py). Each query is quantized to
int16 (one scale per query, max|q| / 32767) and each score is an exact int32 sum of
vpdpwssd-style pair products (2 dimensions a lane) times the two scales; the softmax weights
times V's row scales are quantized to int16 per query the same way and the outputs are exact
int32 sums over pairs of keys, moved to float every FLUSH_PAIRS pairs. Integer sums do not
depend on their order, so verify rows again equal decode rows bit for bit. (Converting every
int8 value to float instead cost a conversion and a sign extension per 16 values on top of
the fmas: docs/kernels.md.) The pair dots come from dots.dot2 and dots.dot2_split, per CPU
class.

Key layout: K is stored in tiles of 64 keys, V row-major (engine/kernels/kv_layout.py).

An f32 cache passes all-ones scales; multiplying by 1.0 is exact.
"""

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange
from numba.core import types
from numba.extending import intrinsic, overload

from . import FASTMATH
from .actquant import INV_LEVEL16
from .dots import SPLIT_PAIRS, dot2, dot2_split
from .irtools import pick, prefetch, stack_f32, stack_i32
from .kv_layout import KEY_BLOCK, KEY_PAIRS
from .mathfn import fast_exp
from .target import TARGET

GROUP = TARGET.group  # int32 lanes of one integer dot vector (as in qgroup)
_X86 = TARGET.x86_ir

AFASTMATH = FASTMATH - {"reassoc"}
# Register tiles of 16 accumulator registers: queries x keys for scores, queries x dimensions
# for values: 4 x 64 on x86, 2 x 32 on NEON (a 4 x 64 tile spilled there: docs/kernels.md).
SCORE_QUERIES, SCORE_KEYS = (4, 64) if _X86 else (2, 32)
VALUE_QUERIES, DIM_BLOCK = (4, 64) if _X86 else (2, 32)
SCORE_FLOATS = SCORE_QUERIES * SCORE_KEYS
MAX_LANES = 16  # running maxima in softmax
# keys a step of softmax's exp (_exp_row): 16 on NEON; on x86 one (a plain loop, which LLVM
# vectorises one vector a step): with AVX2's 16 registers two chains and their constants
# spilled, 2.5 cycles a key against 2.0-2.2 (session 33)
EXP_BLOCK = 1 if _X86 else 16
FLUSH_PAIRS = 128  # key pairs an int32 value accumulator takes before it moves to float
VALUE_FLOATS = VALUE_QUERIES * DIM_BLOCK
WIDE_BLOCK = 2 * DIM_BLOCK  # dimensions a tile of up to VALUE_QUERIES // 2 queries takes
CACHE_LINE = 64
# software prefetch distance in the K and V streams, bytes (a hint on top of the hardware
# prefetchers; measured in docs/kernels.md)
KV_PREFETCH = 4096


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
    base = (t0 // KEY_BLOCK) * tile.size + u0
    for d in range(tile.shape[0]):
        row = tile[d]
        for line in range(0, width, CACHE_LINE // 4):
            prefetch(k_head, base + d * KEY_BLOCK + line + KV_PREFETCH // 4)
        for u in range(width):
            kf = np.float32(row[u0 + u])
            for m in range(mr):
                acc[m * SCORE_KEYS + u] += qm[m0 + m, d] * kf
    for m in range(mr):
        for u in range(width):
            scores[m0 + m, t0 + u] = acc[m * SCORE_KEYS + u]


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_rows_f32(qx, qsc, m0, mr, k_head, n_max, scores):
    """(qsc: ones, unused)"""
    full = n_max // SCORE_KEYS * SCORE_KEYS
    for t0 in range(0, full, SCORE_KEYS):
        _score_tile(qx, m0, mr, k_head, t0, SCORE_KEYS, scores)
    if full < n_max:
        _score_tile(qx, m0, mr, k_head, full, n_max - full, scores)


@intrinsic
def _key_pair_dots(typingctx, acc, lane0, tiles, k_off, qi, q_off):
    """acc[lane0 + u] += k[u, 2p] q[2p] + k[u, 2p + 1] q[2p + 1] for the SCORE_KEYS keys u of
    one row of an int8 K tile (tiles.flat[k_off:], 2 bytes a key) and the int16 pair p of one
    query (qi.flat[q_off:]): vpdpwssd on x86 with VNNI, plain vector IR elsewhere."""
    arrays_ok = all(
        isinstance(a, types.Array) and a.dtype == dt and a.layout == "C"
        for a, dt in ((tiles, types.int8), (qi, types.int16))
    )
    if not arrays_ok:
        return None
    i8, i32 = ir.IntType(8), ir.IntType(32)
    keys_vec, lanes_vec = ir.VectorType(i8, 2 * GROUP), ir.VectorType(i32, GROUP)

    def codegen(context, builder, signature, args):
        acc_p, lane0_v, tiles_v, k_off_v, qi_v, q_off_v = args
        sig = signature.args
        k_base = builder.gep(context.make_array(sig[2])(context, builder, tiles_v).data, [k_off_v])
        q_ptr = builder.gep(context.make_array(sig[4])(context, builder, qi_v).data, [q_off_v])
        qword = builder.load(builder.bitcast(q_ptr, i32.as_pointer()), align=2)
        for j in range(SCORE_KEYS // GROUP):
            k_ptr = builder.gep(k_base, [i32(2 * GROUP * j)])
            w = builder.load(builder.bitcast(k_ptr, keys_vec.as_pointer()), align=1)
            lane = builder.add(lane0_v, ir.Constant(lane0_v.type, GROUP * j))
            a_ptr = builder.bitcast(builder.gep(acc_p, [lane]), lanes_vec.as_pointer())
            builder.store(dot2(builder, builder.load(a_ptr, align=4), w, qword), a_ptr, align=4)
        return context.get_dummy_value()

    return types.void(acc, lane0, tiles, k_off, qi, q_off), codegen


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_tile_q8(qi, qsc, m0, mr, k_head, t0, width, scores):
    """_score_tile for an int8 cache: exact int32 dots of the int16 queries with the keys,
    then one conversion and the query's scale per score (the key's comes in softmax)."""
    acc_ptr = stack_i32(SCORE_FLOATS)
    acc = carray(acc_ptr, SCORE_FLOATS)
    for i in range(mr * SCORE_KEYS):
        acc[i] = 0
    pairs, row_bytes = k_head.shape[1], k_head.shape[2]
    base = (t0 // KEY_BLOCK) * pairs * row_bytes + KEY_PAIRS * (t0 % KEY_BLOCK)
    for p in range(pairs):
        for line in range(0, KEY_PAIRS * width, CACHE_LINE):
            prefetch(k_head, base + p * row_bytes + line + KV_PREFETCH)
        for m in range(mr):
            _key_pair_dots(
                acc_ptr,
                m * SCORE_KEYS,
                k_head,
                base + p * row_bytes,
                qi,
                (m0 + m) * 2 * pairs + 2 * p,
            )
    for m in range(mr):
        s = qsc[m0 + m]
        for u in range(width):
            scores[m0 + m, t0 + u] = np.float32(acc[m * SCORE_KEYS + u]) * s


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _score_rows_q8(qx, qsc, m0, mr, k_head, n_max, scores):
    full = n_max // SCORE_KEYS * SCORE_KEYS
    for t0 in range(0, full, SCORE_KEYS):
        _score_tile_q8(qx, qsc, m0, mr, k_head, t0, SCORE_KEYS, scores)
    if full < n_max:
        _score_tile_q8(qx, qsc, m0, mr, k_head, full, n_max - full, scores)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _quantize_queries(qm, qi, qsc):
    """qi[m] = rint(qm[m] / qsc[m]) in int16, qsc[m] = max|qm[m]| / 32767 (a zero row: 0)."""
    for m in range(qm.shape[0]):
        amax = np.float32(0.0)
        for d in range(qm.shape[1]):
            amax = max(amax, abs(qm[m, d]))
        sc = amax * INV_LEVEL16
        inv = np.float32(0.0) if sc == 0 else np.float32(1.0) / sc
        for d in range(qm.shape[1]):
            qi[m, d] = np.int16(np.rint(qm[m, d] * inv))
        qsc[m] = sc


def _queries(qm, k_head):
    """The queries as the score tiles of k_head's format take them: (qx, qsc)."""


def _score_rows(qx, qsc, m0, mr, k_head, n_max, scores):
    """scores[m0 : m0 + mr, :n_max] for k_head's format."""


@overload(_queries, inline="always")
def _queries_impl(qm, k_head):
    if k_head.dtype == types.int8:

        def quantized(qm, k_head):
            qi = np.empty(qm.shape, np.int16)
            qsc = np.empty(qm.shape[0], np.float32)
            _quantize_queries(qm, qi, qsc)
            return qi, qsc

        return quantized

    def as_they_are(qm, k_head):
        return qm, np.ones(qm.shape[0], np.float32)

    return as_they_are


@overload(_score_rows, inline="always")
def _score_rows_impl(qx, qsc, m0, mr, k_head, n_max, scores):
    return (_score_rows_q8 if k_head.dtype == types.int8 else _score_rows_f32).py_func


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _value_tile_f32(wx, wsc, m0, mr, v_head, n_max, d0, width, block, out_rows):
    """out_rows[m0 + m, d0 + u] = sum_t wx[m0 + m, t] * v_head[t, d0 + u] for u < width, in a
    register tile of mr queries x block dimensions (wsc: ones, unused)."""
    acc = carray(stack_f32(VALUE_FLOATS), VALUE_FLOATS)
    for i in range(mr * block):
        acc[i] = 0.0
    head_dim = v_head.shape[1]
    for t in range(n_max):
        row = v_head[t]
        for line in range(0, width, CACHE_LINE // 4):
            prefetch(v_head, t * head_dim + d0 + line + KV_PREFETCH // 4)
        for u in range(width):
            vf = np.float32(row[d0 + u])
            for m in range(mr):
                acc[m * block + u] += wx[m0 + m, t] * vf
    for m in range(mr):
        for u in range(width):
            out_rows[m0 + m, d0 + u] = acc[m * block + u]


@intrinsic
def _value_pair_dots(typingctx, acc, lane0, v, a_off, b_off, wq, w_off, lanes):
    """acc[lane0 + u] += v.flat[a_off + u] w[0] + v.flat[b_off + u] w[1] for u < lanes (a
    literal multiple of GROUP): the same dimensions of two V rows (keys t, t + 1), interleaved
    in registers into the pairs one vpdpwssd lane sums, and the two keys' int16 weights
    (wq.flat[w_off:])."""
    arrays_ok = all(
        isinstance(a, types.Array) and a.dtype == dt and a.layout == "C"
        for a, dt in ((v, types.int8), (wq, types.int16))
    )
    if not (arrays_ok and isinstance(lanes, types.IntegerLiteral)):
        return None
    n = lanes.literal_value
    i8, i32 = ir.IntType(8), ir.IntType(32)
    row_vec, lanes_vec = ir.VectorType(i8, n), ir.VectorType(i32, GROUP)
    interleave = ir.Constant(
        ir.VectorType(i32, 2 * n), [u // 2 + n * (u % 2) for u in range(2 * n)]
    )

    def codegen(context, builder, signature, args):
        acc_p, lane0_v, v_v, a_v, b_v, wq_v, w_v, _ = args
        sig = signature.args
        data = context.make_array(sig[2])(context, builder, v_v).data
        rows = [
            builder.load(builder.bitcast(builder.gep(data, [off]), row_vec.as_pointer()), align=1)
            for off in (a_v, b_v)
        ]
        pairs = builder.shuffle_vector(rows[0], rows[1], interleave)
        w_ptr = builder.gep(context.make_array(sig[5])(context, builder, wq_v).data, [w_v])
        wword = builder.load(builder.bitcast(w_ptr, i32.as_pointer()), align=2)
        for j in range(n // GROUP):
            lane = builder.add(lane0_v, ir.Constant(lane0_v.type, GROUP * j))
            a_ptr = builder.bitcast(builder.gep(acc_p, [lane]), lanes_vec.as_pointer())
            acc = builder.load(a_ptr, align=4)
            if SPLIT_PAIRS:  # the two rows' parts as they are (dots.dot2_split)
                a, b = (pick(builder, r, range(GROUP * j, GROUP * (j + 1))) for r in rows)
                acc = dot2_split(builder, acc, a, b, wword)
            else:
                part = pick(builder, pairs, range(2 * GROUP * j, 2 * GROUP * (j + 1)))
                acc = dot2(builder, acc, part, wword)
            builder.store(acc, a_ptr, align=4)
        return context.get_dummy_value()

    return types.void(acc, lane0, v, a_off, b_off, wq, w_off, lanes), codegen


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _value_tile_q8(wx, wsc, m0, mr, v_head, n_max, d0, width, block, out_rows):
    """_value_tile_f32 for an int8 cache: exact int32 sums of the int16 weights wx (softmax x
    the key's scale) times the values, two keys per dot instruction, moved into float every
    FLUSH_PAIRS pairs (before they could overflow: 2 x 32767 x 127 a pair); then the query's
    scale wsc. Keys past n_max have weight 0 (the last odd key pairs with itself)."""
    acc_ptr = stack_i32(VALUE_FLOATS)
    acc = carray(acc_ptr, VALUE_FLOATS)
    total = carray(stack_f32(VALUE_FLOATS), VALUE_FLOATS)
    for i in range(mr * block):
        acc[i] = 0
        total[i] = 0.0
    head_dim, n_w = v_head.shape[1], wx.shape[1]
    vec = width // GROUP * GROUP
    for t0 in range(0, n_max, 2 * FLUSH_PAIRS):
        for t in range(t0, min(t0 + 2 * FLUSH_PAIRS, n_max), 2):
            t1 = min(t + 1, n_max - 1)
            a, b = t * head_dim + d0, t1 * head_dim + d0
            for line in range(0, width, CACHE_LINE):
                prefetch(v_head, a + line + KV_PREFETCH)
                prefetch(v_head, b + line + KV_PREFETCH)
            for m in range(mr):
                w_off = (m0 + m) * n_w + t
                if width == block:
                    for j in range(0, block, DIM_BLOCK):
                        _value_pair_dots(
                            acc_ptr, m * block + j, v_head, a + j, b + j, wx, w_off, DIM_BLOCK
                        )
                else:
                    for j in range(0, vec, GROUP):
                        _value_pair_dots(
                            acc_ptr, m * block + j, v_head, a + j, b + j, wx, w_off, GROUP
                        )
                    w0, w1 = np.int32(wx[m0 + m, t]), np.int32(wx[m0 + m, t + 1])
                    for u in range(vec, width):
                        va, vb = np.int32(v_head[t, d0 + u]), np.int32(v_head[t1, d0 + u])
                        acc[m * block + u] += va * w0 + vb * w1
        for i in range(mr * block):
            total[i] += np.float32(acc[i])
            acc[i] = 0
    for m in range(mr):
        s = wsc[m0 + m]
        for u in range(width):
            out_rows[m0 + m, d0 + u] = total[m * block + u] * s


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _quantize_weights(scores, n_max, wq, wsc):
    """wq[m, :n_max] = rint(scores[m] / wsc[m]) in int16, wsc[m] = max scores[m] / 32767
    (scores are >= 0); the column past an odd n_max is 0."""
    for m in range(scores.shape[0]):
        sc = _vector_max(scores[m], n_max) * INV_LEVEL16
        inv = np.float32(0.0) if sc <= 0 else np.float32(1.0) / sc
        _round_row(scores[m], n_max, inv, wq[m])
        for t in range(n_max, wq.shape[1]):
            wq[m, t] = 0
        wsc[m] = sc


def _weights(scores, n_max, v_head):
    """The softmax weights as the value tiles of v_head's format take them: (wx, wsc)."""


def _value_tile(wx, wsc, m0, mr, v_head, n_max, d0, width, block, out_rows):
    """One register tile of out_rows for v_head's format."""


@overload(_weights, inline="always")
def _weights_impl(scores, n_max, v_head):
    if v_head.dtype == types.int8:

        def quantized(scores, n_max, v_head):
            wq = np.empty((scores.shape[0], n_max + n_max % 2), np.int16)
            wsc = np.empty(scores.shape[0], np.float32)
            _quantize_weights(scores, n_max, wq, wsc)
            return wq, wsc

        return quantized

    def as_they_are(scores, n_max, v_head):
        return scores, np.ones(scores.shape[0], np.float32)

    return as_they_are


@overload(_value_tile, inline="always")
def _value_tile_impl(wx, wsc, m0, mr, v_head, n_max, d0, width, block, out_rows):
    return (_value_tile_q8 if v_head.dtype == types.int8 else _value_tile_f32).py_func


@njit(nogil=True, cache=True, fastmath=AFASTMATH, inline="always")
def _value_rows(wx, wsc, m0, mr, v_head, n_max, out_rows):
    """out_rows[m0 : m0 + mr]. Up to VALUE_QUERIES // 2 queries (a decode step's query pair)
    take WIDE_BLOCK dimensions a tile, so each V row is read in one pass instead of one per
    DIM_BLOCK dimensions (a stride of the row per pass, which the prefetchers followed less
    well from DRAM). Qwen3-VL's head_dim is 128; other sizes end in a partial tile, summed
    GROUP lanes at a time (a second, 64-wide copy for them took the int8 kernel's cold
    compile from 71 to 124 s)."""
    head_dim = v_head.shape[1]
    block = WIDE_BLOCK if 2 * mr <= VALUE_QUERIES else DIM_BLOCK  # a constant once inlined
    full = head_dim // block * block
    for d0 in range(0, full, block):
        _value_tile(wx, wsc, m0, mr, v_head, n_max, d0, block, block, out_rows)
    if full < head_dim:
        _value_tile(wx, wsc, m0, mr, v_head, n_max, full, head_dim - full, block, out_rows)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _vector_max(x, n):
    """max(x[:n]) in MAX_LANES running maxima: one running max is a chain of scalar compares
    (LLVM vectorises a max reduction only under the no-NaN flag, and did not merge 16 scalar
    maxima either), which took longer than softmax's exps."""
    lanes_ptr = stack_f32(MAX_LANES)
    lanes = carray(lanes_ptr, MAX_LANES)
    for u in range(MAX_LANES):
        lanes[u] = -3.0e38
    full = n // MAX_LANES * MAX_LANES
    for t0 in range(0, full, MAX_LANES):
        _lanes_max(lanes_ptr, x, t0)
    best = np.float32(-3.0e38)
    for t in range(full, n):
        best = max(best, x[t])
    for u in range(MAX_LANES):
        best = max(best, lanes[u])
    return best


@intrinsic
def _lanes_max(typingctx, lanes, arr, i0):
    """lanes[u] = max(lanes[u], arr[i0 + u]) for u < MAX_LANES: one vector compare and
    select (a NaN in arr is skipped; it reaches the softmax output through the exps)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None
    vec = ir.VectorType(ir.FloatType(), MAX_LANES)

    def codegen(context, builder, signature, args):
        lanes_p, arr_v, i0_v = args
        data = context.make_array(signature.args[1])(context, builder, arr_v).data
        x = builder.load(builder.bitcast(builder.gep(data, [i0_v]), vec.as_pointer()), align=4)
        acc_p = builder.bitcast(lanes_p, vec.as_pointer())
        acc = builder.load(acc_p, align=4)
        builder.store(builder.select(builder.fcmp_ordered(">", x, acc), x, acc), acc_p, align=4)
        return context.get_dummy_value()

    return types.void(lanes, arr, i0), codegen


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def _softmax_row(sc, n_keys, k_scale, v_scale, scale):
    """sc[:n_keys] = softmax(sc * k_scale * scale) * v_scale; sc[n_keys:] = 0, in the passes of
    ROW_PASSES. Reassociation is allowed here (vectorised max, exp and sum: without it this
    took as long as both matrix passes); the order depends only on n_keys, which a query has
    in decode and in verify alike."""
    _scale_row(sc, n_keys, k_scale, scale)
    best = _vector_max(sc, n_keys)
    _exp_row(sc, n_keys, best)
    inv = np.float32(1.0) / _sum_row(sc, n_keys)
    _normalize_row(sc, n_keys, inv, v_scale)
    for t in range(n_keys, sc.shape[0]):
        sc[t] = 0.0


# The passes over a query's keys outside the integer products, in the order a query runs them
# (_softmax_row, then _quantize_weights for an int8 cache); bench/board.py compiles each on
# its own to model its cycles a key.
ROW_PASSES = (
    "_scale_row",
    "_vector_max",
    "_exp_row",
    "_sum_row",
    "_normalize_row",
    "_vector_max",
    "_round_row",
)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _scale_row(sc, n, k_scale, scale):
    """sc[:n] *= k_scale[:n] * scale."""
    for t in range(n):
        sc[t] *= k_scale[t] * scale


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _exp_row(sc, n, best):
    """sc[:n] = exp(sc[:n] - best) in blocks of EXP_BLOCK keys (_exp_blocks)."""
    _exp_blocks(sc, n, best, EXP_BLOCK)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _exp_blocks(sc, n, best, block):
    """sc[:n] = exp(sc[:n] - best), `block` keys a step (a constant once inlined): LLVM unrolls
    the block and packs it into several vectors whose polynomials overlap (a plain loop did
    one NEON vector a step, its ~60-cycle chain of fmlas the bound: 13.8 cycles a key on the
    Cortex-A76's tables, 4.2 in blocks of 16; docs/benchmarks.md, session 33); the rest one
    key at a time."""
    full = n // block * block
    for t0 in range(0, full, block):
        for u in range(block):
            sc[t0 + u] = fast_exp(sc[t0 + u] - best)
    for t in range(full, n):
        sc[t] = fast_exp(sc[t] - best)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _sum_row(sc, n):
    """sum(sc[:n]) (reassociated: vector partial sums)."""
    total = np.float32(0.0)
    for t in range(n):
        total += sc[t]
    return total


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _normalize_row(sc, n, inv, v_scale):
    """sc[:n] *= inv * v_scale[:n]."""
    for t in range(n):
        sc[t] *= inv * v_scale[t]


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _round_row(src, n, inv, dst):
    """dst[:n] = rint(src[:n] * inv) as int16."""
    for t in range(n):
        dst[t] = np.int16(np.rint(src[t] * inv))


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def exp_minus_row_max(scores):
    """scores[r] = exp(scores[r] - max(scores[r])) for each row r of a 2-D f32 array, in
    place: softmax's numerator in two passes over each row while it is in cache (the
    bidirectional attention of engine/vision, whose denominators come from its value
    product). The order of every row's operations depends only on its length."""
    n = scores.shape[1]
    for r in range(scores.shape[0]):
        row = scores[r]
        _exp_row(row, n, _vector_max(row, n))


@njit(nogil=True, cache=True, fastmath=AFASTMATH, parallel=True)
def attention(q, k_tiles, k_scale, v, v_scale, start, scale, out):
    """q: [N, NH, HD] f32; k_tiles: the keys in tiles of 64 (key_tile_shape), v: [NKV, cap,
    HD], both f32 or both int8 (C-contiguous), holding cache indexes 0..start+N-1; k_scale,
    v_scale: [NKV, cap] f32 (row scales; ones for f32). Query n sits at cache index start + n
    and sees keys 0..start+n. out: [N, NH * HD] f32."""
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
        qx, qsc = _queries(qm, k_head)
        m0 = 0
        while m0 + SCORE_QUERIES <= n_q:
            _score_rows(qx, qsc, m0, SCORE_QUERIES, k_head, n_max, scores)
            m0 += SCORE_QUERIES
        rest = n_q - m0
        if rest == 3 and SCORE_QUERIES > 3:
            _score_rows(qx, qsc, m0, 3, k_head, n_max, scores)
        elif rest == 2 and SCORE_QUERIES > 2:
            _score_rows(qx, qsc, m0, 2, k_head, n_max, scores)
        elif rest == 1:
            _score_rows(qx, qsc, m0, 1, k_head, n_max, scores)
        for m in range(n_q):
            _softmax_row(scores[m], start + m // group + 1, k_scale[g], v_scale[g], scale)
        out_rows = np.empty((n_q, head_dim), np.float32)
        v_head = v[g]
        wx, wsc = _weights(scores, n_max, v_head)
        m0 = 0
        while m0 + VALUE_QUERIES <= n_q:
            _value_rows(wx, wsc, m0, VALUE_QUERIES, v_head, n_max, out_rows)
            m0 += VALUE_QUERIES
        rest = n_q - m0
        if rest == 3 and VALUE_QUERIES > 3:
            _value_rows(wx, wsc, m0, 3, v_head, n_max, out_rows)
        elif rest == 2 and VALUE_QUERIES > 2:
            _value_rows(wx, wsc, m0, 2, v_head, n_max, out_rows)
        elif rest == 1:
            _value_rows(wx, wsc, m0, 1, v_head, n_max, out_rows)
        for m in range(n_q):
            n = m // group
            h = h0 + m % group
            for d in range(head_dim):
                out[n, h * head_dim + d] = out_rows[m, d]
