"""Attention among the tokens of one span that all see each other (the vision encoder's), fused
in one pass with integer products: scores, softmax and values per block of keys, the scores
never written out.

Per head and tile of QUERIES queries, for each block of KEY_BLOCK keys (an online softmax, as
flash attention does it):

  scores   exact int32 dots of the int8 queries (one scale a query) with the int8 keys (one
           scale a key), in register tiles of QUERIES x SCORE_LANES keys (dots.dot4: vpdpbusd,
           sdot, the AVX2 pair, plain IR), then one conversion and the two scales;
  softmax  the block's max b per query, e = exp(s - b) quantized to 0..127 (one scale per
           query and block: the block's largest weight is 127), the running max m, sum l
           and output rescaled by exp(m_old - m_new) when the max grows;
  values   exact int32 dots of those weights with the int8 values (one scale per block of
           keys and dimension), 4 keys a lane, in register tiles of QUERIES x VALUE_LANES
           dimensions; one conversion, then out = out * alpha + that x (weight scale x value
           scale), in float.

So the O(S^2) work is integer dots and one vectorised exp a score; per block and query only
the rescale of one output row is float work. The weights' quantization is the same for the
numerator and the denominator (l sums the quantized weights), so every output stays a
weighted mean of the values. Accuracy against the f32 softmax: docs/vision.md.

Packed layouts (pack_span, per head h, key block b, padded head width DP, a multiple of GROUP):

  qp [H, NQ, DP] int8, qs [H, NQ] query scale x softmax scale, qc [H, NQ] int32 correction
  kp [H, NB, DP/4, KEY_BLOCK, 4]: a vector load is GROUP keys x 4 dimensions (dot4's `w`);
      where dot4's w is unsigned (vpdpbusd, plain IR: dots.SIGNED_QUADS False) each key byte
      is stored + 128 and the query's correction qc = -128 sum(q) is the accumulator's start
  ks [H, NB * KEY_BLOCK] key scales (0 past the span)
  vp [H, NB, KEY_BLOCK/4, DP, 4]: a vector load is GROUP dimensions x 4 keys (dot4's `xs`,
      with the 4 weights of one query broadcast as `w`: weights 0..127 are valid unsigned)
  vs [H, NB, DP] value scales per block and dimension

Keys past the span have score -inf (weight 0); queries past it are computed and dropped.
Outputs do not depend on the thread count: each (head, query tile) is computed by the same
operations whichever thread runs it.
"""

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import FASTMATH
from .dots import SIGNED_QUADS, dot4
from .irtools import F32, I8, I32, pick, splat, stack_f32, stack_i8, stack_i32, vec
from .mathfn import fast_exp
from .target import TARGET

GROUP = TARGET.group  # int32 lanes of one dot vector
QUERIES = 4 if GROUP == 16 else 2  # queries per register tile (32 vector registers or 16)
SCORE_VECS = VALUE_VECS = 4  # accumulator vectors per query in a register tile
SCORE_LANES = SCORE_VECS * GROUP  # keys of one score register tile
VALUE_LANES = VALUE_VECS * GROUP  # dimensions of one value register tile
KEY_BLOCK = 128  # keys per softmax block (a multiple of SCORE_LANES; 64 was 11% slower)
KEY_BIAS = 0 if SIGNED_QUADS else 128
LEVEL = 127  # int8 quantization levels of queries, keys, values and weights
TILES_PER_TASK = 16  # query tiles one parallel task takes
NEG = np.float32(-3.0e38)
BLOCK_SCORES = QUERIES * KEY_BLOCK  # scores (and weights) of one query tile and key block
SCORE_ACCS = QUERIES * SCORE_LANES
VALUE_ACCS = QUERIES * VALUE_LANES
TAIL_ACCS = QUERIES * GROUP


def padded_width(head_dim: int) -> int:
    """The head width the packed arrays use: a multiple of GROUP."""
    return -(-head_dim // GROUP) * GROUP


def new_packed(heads: int, n: int, head_dim: int) -> tuple[np.ndarray, ...]:
    """Empty (qp, qs, qc, kp, ks, vp, vs) for a span of n tokens, in the order pack_span and
    span_attention take them (layouts in the module docstring)."""
    dp = padded_width(head_dim)
    nq = -(-n // QUERIES) * QUERIES
    nb = -(-n // KEY_BLOCK)
    return (
        np.empty((heads, nq, dp), np.int8),
        np.empty((heads, nq), np.float32),
        np.empty((heads, nq), np.int32),
        np.empty((heads, nb, dp // 4, KEY_BLOCK, 4), np.int8),
        np.empty((heads, nb * KEY_BLOCK), np.float32),
        np.empty((heads, nb, KEY_BLOCK // 4, dp, 4), np.int8),
        np.empty((heads, nb, dp), np.float32),
    )


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _row_scale(x, d):
    """max |x[:d]| / LEVEL (0 for an all-zero row)."""
    amax = np.float32(0.0)
    for i in range(d):
        amax = max(amax, abs(x[i]))
    return amax / np.float32(LEVEL)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _inverse(sc):
    return np.float32(0.0) if sc == 0 else np.float32(1.0) / sc


@njit(nogil=True, cache=True, parallel=True)
def pack_span(q, k, v, s0, n, scale, qp, qs, qc, kp, ks, vp, vs):
    """Quantize and lay out tokens s0..s0+n of q, k, v ([H, S, D] f32) for span_attention
    (layouts in the module docstring; arrays from new_packed). scale: the softmax scale.
    Padding (queries, keys and dimensions past the span and the head width) packs zeros."""
    heads, _, d = q.shape
    dp, nb = qp.shape[2], kp.shape[1]
    for h in prange(heads):
        qp[h] = 0
        qs[h] = 0.0
        qc[h] = 0
        kp[h] = KEY_BIAS  # a zero key (wraps to the byte's bit pattern)
        ks[h] = 0.0
        vp[h] = 0
        for i in range(n):
            row, dst = q[h, s0 + i], qp[h, i]
            sc = _row_scale(row, d)
            inv = _inverse(sc)
            total = 0
            for j in range(d):
                x = np.int32(np.rint(row[j] * inv))
                dst[j] = x
                total += x
            qs[h, i] = sc * np.float32(scale)
            qc[h, i] = -KEY_BIAS * total
        for t in range(n):
            row, dst = k[h, s0 + t], kp[h, t // KEY_BLOCK]
            u = t % KEY_BLOCK
            sc = _row_scale(row, d)
            inv = _inverse(sc)
            ks[h, t] = sc
            for j in range(d):
                dst[j // 4, u, j % 4] = np.int32(np.rint(row[j] * inv)) + KEY_BIAS
        amax = np.empty(d, np.float32)
        for b in range(nb):
            t0, t1 = b * KEY_BLOCK, min(n, (b + 1) * KEY_BLOCK)
            amax[:] = 0.0
            for t in range(t0, t1):
                row = v[h, s0 + t]
                for j in range(d):
                    amax[j] = max(amax[j], abs(row[j]))
            for j in range(d):
                vs[h, b, j] = amax[j] / np.float32(LEVEL)
                amax[j] = _inverse(vs[h, b, j])
            for j in range(d, dp):
                vs[h, b, j] = 0.0
            dst = vp[h, b]
            for t in range(t0, t1):
                row, u = v[h, s0 + t], t - t0
                for j in range(d):
                    dst[u // 4, j, u % 4] = np.int32(np.rint(row[j] * amax[j]))


def _dot_vectors(builder, acc_p, lane0, base, word, count: int, word_is_w: bool):
    """acc[lane0 + GROUP j + u] += dot4 of the 4 bytes of lane u of vector j at base (GROUP x 4
    bytes a vector) with the broadcast i32 word, for j < count. word_is_w: the word is dot4's
    `w` operand (weights 0..127), else its `xs` (signed queries)."""
    lanes, quads = vec(I32, GROUP), vec(I8, 4 * GROUP)
    broadcast = builder.bitcast(splat(builder, word, lanes), quads)
    for j in range(count):
        ptr = builder.gep(base, [I32(4 * GROUP * j)])
        loaded = builder.load(builder.bitcast(ptr, quads.as_pointer()), align=1)
        w, xs = (broadcast, loaded) if word_is_w else (loaded, broadcast)
        lane = builder.add(lane0, ir.Constant(lane0.type, GROUP * j))
        a_ptr = builder.bitcast(builder.gep(acc_p, [lane]), lanes.as_pointer())
        total = dot4(builder, builder.load(a_ptr, align=4), w, xs, w_below_128=word_is_w)
        builder.store(total, a_ptr, align=4)


def _word(builder, ptr):
    """The 4 bytes at ptr as an i32."""
    return builder.load(builder.bitcast(ptr, I32.as_pointer()), align=1)


@intrinsic
def _score_dots(typingctx, acc, lane0, kp, k_off, qp, q_off):
    """acc[lane0 + u] += the 4-byte dot of key u (kp.flat[k_off + 4u:]) with the query word at
    qp.flat[q_off:], for u < SCORE_LANES."""
    if not all(isinstance(a, types.Array) and a.dtype == types.int8 for a in (kp, qp)):
        return None

    def codegen(context, builder, signature, args):
        acc_p, lane0_v, kp_v, k_off_v, qp_v, q_off_v = args
        sig = signature.args
        k_base = builder.gep(context.make_array(sig[2])(context, builder, kp_v).data, [k_off_v])
        q_ptr = builder.gep(context.make_array(sig[4])(context, builder, qp_v).data, [q_off_v])
        word = _word(builder, q_ptr)
        _dot_vectors(builder, acc_p, lane0_v, k_base, word, SCORE_VECS, word_is_w=False)
        return context.get_dummy_value()

    return types.void(acc, lane0, kp, k_off, qp, q_off), codegen


@intrinsic
def _value_dots(typingctx, acc, lane0, vp, v_off, p, p_off, vectors):
    """acc[lane0 + u] += the 4-key dot of dimension u (vp.flat[v_off + 4u:]) with the 4 weights
    at p[p_off:] (a byte pointer), for u < vectors x GROUP (vectors a literal)."""
    if not (isinstance(vectors, types.IntegerLiteral) and vp.dtype == types.int8):
        return None
    count = vectors.literal_value

    def codegen(context, builder, signature, args):
        acc_p, lane0_v, vp_v, v_off_v, p_v, p_off_v, _ = args
        v_data = context.make_array(signature.args[2])(context, builder, vp_v).data
        word = _word(builder, builder.gep(p_v, [p_off_v]))
        v_base = builder.gep(v_data, [v_off_v])
        _dot_vectors(builder, acc_p, lane0_v, v_base, word, count, word_is_w=True)
        return context.get_dummy_value()

    return types.void(acc, lane0, vp, v_off, p, p_off, vectors), codegen


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _scores(qp, qs, qc, kp, ks, h, i0, b, sf):
    """sf[m * KEY_BLOCK + u] = score of query i0 + m with key u of block b (float, scaled)."""
    dp = qp.shape[2]
    acc_ptr = stack_i32(SCORE_ACCS)
    acc = carray(acc_ptr, SCORE_ACCS)
    for j0 in range(0, KEY_BLOCK, SCORE_LANES):
        for m in range(QUERIES):
            c = qc[h, i0 + m]
            for u in range(SCORE_LANES):
                acc[m * SCORE_LANES + u] = c
        for d4 in range(dp // 4):
            k_off = (((h * kp.shape[1] + b) * (dp // 4) + d4) * KEY_BLOCK + j0) * 4
            for m in range(QUERIES):
                _score_dots(
                    acc_ptr,
                    m * SCORE_LANES,
                    kp,
                    k_off,
                    qp,
                    (h * qp.shape[1] + i0 + m) * dp + 4 * d4,
                )
        for m in range(QUERIES):
            s = qs[h, i0 + m]
            for u in range(SCORE_LANES):
                sf[m * KEY_BLOCK + j0 + u] = np.float32(acc[m * SCORE_LANES + u]) * (
                    s * ks[h, b * KEY_BLOCK + j0 + u]
                )


@intrinsic
def _block_max(typingctx, sf, i0):
    """max(sf[i0 : i0 + KEY_BLOCK]) of a float pointer: a vector load and a tree of compares
    (LLVM vectorises a max reduction only under the no-NaN flag). A NaN score is skipped here
    and gets weight 0 in _block_weights; the NaN that made it is in the encoder's residual
    stream too, so the answer's logits are NaN all the same (engine/finite.py reports it)."""
    vtype = vec(F32, KEY_BLOCK)

    def codegen(context, builder, signature, args):
        sf_p, i0_v = args
        x = builder.load(builder.bitcast(builder.gep(sf_p, [i0_v]), vtype.as_pointer()), align=4)
        width = KEY_BLOCK
        while width > 1:
            width //= 2
            lo = pick(builder, x, range(width))
            hi = pick(builder, x, range(width, 2 * width))
            x = builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo)
        return builder.extract_element(x, I32(0))

    return types.float32(sf, i0), codegen


# exp(x) = 2^(x log2 e): 2^n from exponent bits times a degree-4 Taylor polynomial of 2^f for
# f in [-0.5, 0.5] (relative error below 4e-5, far under the weights' 1/127 steps), with
# LEVEL folded into its coefficients.
_LN2 = 0.6931471805599453
_EXP2_POLY = [LEVEL * _LN2**i / f for i, f in enumerate((1, 1, 2, 6, 24))]
_MIN_EXPONENT = -30.0  # 2^-30 x LEVEL rounds to 0: clamping there keeps 2^n a normal float
_LOG2E = 1.4426950408889634
W = 16  # floats per vector of the weights' arithmetic


@intrinsic
def _block_weights(typingctx, sf, i0, top, pb):
    """pb[i0 + u] = rint(LEVEL exp(sf[i0 + u] - top)) for u < KEY_BLOCK (sf a float pointer,
    pb a byte pointer, every sf <= top); returns the sum of those weights (exact in float)."""
    vf, vi = vec(F32, W), vec(I32, W)

    def const(x):
        return ir.Constant(vf, [float(x)] * W)

    def codegen(context, builder, signature, args):
        sf_p, i0_v, top_v, pb_p = args
        rint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf]), "llvm.rint.v16f32"
        )
        shift = splat(builder, builder.fmul(top_v, ir.Constant(F32, _LOG2E)), vf)
        total = const(0.0)
        for c in range(KEY_BLOCK // W):
            off = builder.add(i0_v, ir.Constant(i0_v.type, W * c))
            x = builder.load(builder.bitcast(builder.gep(sf_p, [off]), vf.as_pointer()), align=4)
            t = builder.fsub(builder.fmul(x, const(_LOG2E)), shift)
            t = builder.select(
                builder.fcmp_ordered(">", t, const(_MIN_EXPONENT)), t, const(_MIN_EXPONENT)
            )
            n = builder.call(rint, [t])
            f = builder.fsub(t, n)
            p = const(_EXP2_POLY[4])
            for coef in reversed(_EXP2_POLY[:4]):
                p = builder.fadd(builder.fmul(p, f), const(coef))
            bits = builder.shl(
                builder.add(builder.fptosi(n, vi), ir.Constant(vi, [127] * W)),
                ir.Constant(vi, [23] * W),
            )
            w = builder.call(rint, [builder.fmul(p, builder.bitcast(bits, vf))])
            total = builder.fadd(total, w)
            dst = builder.bitcast(builder.gep(pb_p, [off]), vec(I8, W).as_pointer())
            builder.store(builder.trunc(builder.fptosi(w, vi), vec(I8, W)), dst, align=1)
        width = W
        while width > 1:
            width //= 2
            total = builder.fadd(
                pick(builder, total, range(width)), pick(builder, total, range(width, 2 * width))
            )
        return builder.extract_element(total, I32(0))

    return types.float32(sf, i0, top, pb), codegen


@intrinsic
def _rescale_add(typingctx, acc, lane0, out, out_off, vs, vs_off, factor, alpha, lanes):
    """out.flat[out_off + j] = out * alpha + acc[lane0 + j] x factor x vs.flat[vs_off + j] for
    j < lanes (a literal): one query's values of a block added to its running output."""
    if not isinstance(lanes, types.IntegerLiteral):
        return None
    n = lanes.literal_value
    vf, vi = vec(F32, n), vec(I32, n)

    def codegen(context, builder, signature, args):
        acc_p, lane0_v, out_v, out_off_v, vs_v, vs_off_v, factor_v, alpha_v, _ = args
        sig = signature.args
        a = builder.load(builder.bitcast(builder.gep(acc_p, [lane0_v]), vi.as_pointer()), align=4)
        vs_ptr = builder.gep(context.make_array(sig[4])(context, builder, vs_v).data, [vs_off_v])
        scales = builder.load(builder.bitcast(vs_ptr, vf.as_pointer()), align=4)
        x = builder.fmul(builder.sitofp(a, vf), builder.fmul(scales, splat(builder, factor_v, vf)))
        o_ptr = builder.gep(context.make_array(sig[2])(context, builder, out_v).data, [out_off_v])
        o_ptr = builder.bitcast(o_ptr, vf.as_pointer())
        old = builder.load(o_ptr, align=4)
        builder.store(
            builder.fadd(builder.fmul(old, splat(builder, alpha_v, vf)), x), o_ptr, align=4
        )
        return context.get_dummy_value()

    return types.void(acc, lane0, out, out_off, vs, vs_off, factor, alpha, lanes), codegen


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _update_rows(acc, lanes, vs, h, b, alpha, factor, out, row0, rows, col, j0, d):
    """out[row0 + m, col + j0 + j] = out * alpha[m] + acc[m * lanes + j] x factor[m] x the
    value scale of dimension j0 + j, for m < rows and j0 + j < d (the partial tiles)."""
    for m in range(rows):
        row = out[row0 + m]
        for j in range(min(lanes, d - j0)):
            x = np.float32(acc[m * lanes + j]) * (factor[m] * vs[h, b, j0 + j])
            row[col + j0 + j] = row[col + j0 + j] * alpha[m] + x


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _values(vp, vs, h, b, pb_ptr, alpha, factor, out, row0, rows, col, d):
    """out[row0 + m, col + j] = out * alpha[m] + (weights of query m . values j) x factor[m] x
    the value scale, for m < rows and j < d: register tiles of VALUE_LANES dimensions, then
    tiles of GROUP for the rest of the padded width."""
    dp = vp.shape[3]
    v_block = (h * vp.shape[1] + b) * (KEY_BLOCK // 4)
    acc_ptr = stack_i32(VALUE_ACCS)
    acc = carray(acc_ptr, VALUE_ACCS)
    full = dp // VALUE_LANES * VALUE_LANES
    for j0 in range(0, full, VALUE_LANES):
        for i in range(VALUE_ACCS):
            acc[i] = 0
        for t4 in range(KEY_BLOCK // 4):
            v_off = ((v_block + t4) * dp + j0) * 4
            for m in range(QUERIES):
                p_off = m * KEY_BLOCK + 4 * t4
                _value_dots(acc_ptr, m * VALUE_LANES, vp, v_off, pb_ptr, p_off, VALUE_VECS)
        if rows == QUERIES and j0 + VALUE_LANES <= d:
            vs_off = (h * vs.shape[1] + b) * dp + j0
            for m in range(QUERIES):
                out_off = (row0 + m) * out.shape[1] + col + j0
                _rescale_add(
                    acc_ptr,
                    m * VALUE_LANES,
                    out,
                    out_off,
                    vs,
                    vs_off,
                    factor[m],
                    alpha[m],
                    VALUE_LANES,
                )
        else:
            _update_rows(acc, VALUE_LANES, vs, h, b, alpha, factor, out, row0, rows, col, j0, d)
    tail_ptr = stack_i32(TAIL_ACCS)
    tail = carray(tail_ptr, TAIL_ACCS)
    for j0 in range(full, min(dp, d + GROUP - 1), GROUP):
        for i in range(TAIL_ACCS):
            tail[i] = 0
        for t4 in range(KEY_BLOCK // 4):
            v_off = ((v_block + t4) * dp + j0) * 4
            for m in range(QUERIES):
                _value_dots(tail_ptr, m * GROUP, vp, v_off, pb_ptr, m * KEY_BLOCK + 4 * t4, 1)
        _update_rows(tail, GROUP, vs, h, b, alpha, factor, out, row0, rows, col, j0, d)


@njit(nogil=True, cache=True, fastmath=FASTMATH, parallel=True)
def span_attention(qp, qs, qc, kp, ks, vp, vs, n, out, row0, head_dim):
    """out[row0 + i, h * head_dim + j] = softmax over the span's n keys of query i's scores,
    times the values (from pack_span's arrays), for i < n, every head h, j < head_dim."""
    heads, nq = qp.shape[0], qp.shape[1]
    nb = kp.shape[1]
    tiles = nq // QUERIES
    per_head = -(-tiles // TILES_PER_TASK)
    for task in prange(heads * per_head):
        h = task // per_head
        t_lo = (task % per_head) * TILES_PER_TASK
        sf_ptr = stack_f32(BLOCK_SCORES)
        sf = carray(sf_ptr, BLOCK_SCORES)
        pb_ptr = stack_i8(BLOCK_SCORES)
        run_max = carray(stack_f32(QUERIES), QUERIES)
        run_sum = carray(stack_f32(QUERIES), QUERIES)
        alpha = carray(stack_f32(QUERIES), QUERIES)
        factor = carray(stack_f32(QUERIES), QUERIES)
        for tile in range(t_lo, min(tiles, t_lo + TILES_PER_TASK)):
            i0 = tile * QUERIES
            rows = min(QUERIES, n - i0)
            for m in range(QUERIES):
                run_max[m] = NEG
                run_sum[m] = 0.0
            for m in range(rows):
                row = out[row0 + i0 + m]
                for j in range(head_dim):
                    row[h * head_dim + j] = 0.0
            for b in range(nb):
                _scores(qp, qs, qc, kp, ks, h, i0, b, sf)
                keys = n - b * KEY_BLOCK
                if keys < KEY_BLOCK:
                    for m in range(QUERIES):
                        for u in range(keys, KEY_BLOCK):
                            sf[m * KEY_BLOCK + u] = NEG
                for m in range(QUERIES):
                    top = _block_max(sf_ptr, m * KEY_BLOCK)
                    total = _block_weights(sf_ptr, m * KEY_BLOCK, top, pb_ptr)
                    new_max = max(run_max[m], top)
                    alpha[m] = fast_exp(run_max[m] - new_max)
                    factor[m] = fast_exp(top - new_max) * np.float32(1.0 / LEVEL)
                    run_sum[m] = run_sum[m] * alpha[m] + factor[m] * total
                    run_max[m] = new_max
                _values(
                    vp,
                    vs,
                    h,
                    b,
                    pb_ptr,
                    alpha,
                    factor,
                    out,
                    row0 + i0,
                    rows,
                    h * head_dim,
                    head_dim,
                )
            for m in range(rows):
                inv = np.float32(1.0) / run_sum[m]
                row = out[row0 + i0 + m]
                for j in range(head_dim):
                    row[h * head_dim + j] *= inv
