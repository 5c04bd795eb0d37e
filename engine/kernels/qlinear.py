"""Weight matrix products for block-quantized weights (q8_0, q4_0: one scale per 32 weights).

Formats (made by engine/quant.py; C-contiguous, row-major like the f32 weight [O, K]):

    q8: qs int8 [O, K]          weight = qs[o, k] * scale(o, k // 32)
    q4: qs uint8 [O, K // 2]    block b of row o is bytes 16b..16b+15; byte j holds weight
                                32b + j in its low nibble and weight 32b + 16 + j in its high
                                nibble, each stored as q + 8 (q in -8..7)
        scales uint16 [O, K // 32], bfloat16 bits (float32 scale arrays work too)

Small N (decode N = 1, speculative verify N = K + 1 <= 16): `matmul_q8` / `matmul_q4`,
parallel over output rows (16 per task). Each (n, o) output owns 32 lane accumulators held in
registers across its whole row:

    acc[j] = fma(x[n, 32b + j], float(q[o, 32b + j]) * scale[o, b], acc[j])   for b = 0, 1, ...
    out[n, o] = fixed pairwise tree over the 32 lanes

so there is no horizontal sum per block (what made a naive block loop run at 1.9 GB/s) and no
reassociation anywhere: these kernels use FASTMATH without "reassoc" (the lanes are explicit,
LLVM needs no licence to vectorise), so every register tile performs the same float operations
in the same order for a given (n, o). Row n of an N-row call is bitwise equal to a 1-row call
on x[n], for any N and any thread count (tests/test_quant.py checks N = 1..9, 1 and 2
threads). A tile converts a weight block to f32 once for all its activation rows, and a weight
row is read from memory once for all N rows (later tiles find it in L1/L2).

Tiles (measured on the dev box, AMD EPYC Zen 4, 2 cores, see engine/qlinear_bench.py):
  - N <= 3, and the rest of larger N: one weight row x N activation rows. From DRAM this
    streamed 2-3x faster at N = 1..3 than tiles over two adjacent weight rows (which are
    faster in cache: they share each x load) - the reason is not understood; software
    prefetch did not recover it.
  - N >= 4 on AVX-512: 5 (then 4) activation rows x 2 weight rows, 20 zmm accumulators, x
    loads shared by the two rows: ~2x the in-cache throughput of single-row tiles at N >= 4.
  - aarch64 (NEON, 4 lanes per register): a 32-lane accumulator is 8 registers, so tiles are
    at most 2 activation rows x 1 weight row (16 of 32 registers).
Stack scratch (`stack_f32`, an entry-block alloca) holds the accumulators: LLVM keeps them in
registers. A heap array there is hoisted by Numba out of the prange loop and shared by the
tasks of a thread; neighbouring threads' arrays then shared cache lines and a 2-thread call
took 8 ms instead of 1 ms.

Assembly of the hot loops (checked with inspect_asm on x86-64 znver4; aarch64 cortex-a76 read
by compiling Numba's IR with llvmlite for that target):
  x86-64, q8, 1-row tile, per block: vpmovsxbd x2 (int8 -> int32 from memory), vcvtdq2ps x2,
    vmulps x2 by the broadcast scale, vfmadd231ps x2 (x as memory operand), prefetcht0, loop
    unrolled 4 blocks; the 5 x 2 tile: 20 vfmadd231ps per block for 4 vpmovsxbd/vcvtdq2ps/
    vmulps, no spills. q4: vpand + vgf2p8affineqb (LLVM's byte shift) split the nibbles,
    vpmovzxbd, vcvtdq2ps, vfmadd213ps for (u - 8) * s, then the same vfmadd231ps.
  aarch64, q8, 2 x 1 tile: ldp q (32 weights), tbl x8 (bytes to the top of 32-bit lanes),
    scvtf #24 (sign-extend and convert in one), fmul by the dup'ed scale, fmla .4s x16, all 16
    accumulators in registers. q4: and/ushr, ushll, ucvtf, fmla.

Large N (prefill): `matmul_q8_prefill` / `matmul_q4_prefill` dequantize equal tiles of output
rows (<= PREFILL_TILE_FLOATS floats) to f32 into a scratch buffer (parallel Numba kernel) and
multiply with NumPy's BLAS straight into out[:, tile]. The dequantized tile is exactly the
weight the small-N kernels use, but BLAS sums in its own order, so prefill rows are not
bitwise equal to decode rows (nothing needs that: a prompt is never re-verified).

Every kernel has a naive twin (`*_reference`: NumPy dequantize, float64 product) for tests.
Cold compile (first use, cached on disk after): about 8-15 s per kernel here.
"""

import os
import platform

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import FASTMATH

# The lane accumulators make the order explicit; reassociation would let LLVM regroup the
# products differently in different register tiles and break bitwise N-independence.
QFASTMATH = FASTMATH - {"reassoc"}

BLOCK = 32
ROWS_PER_TASK = 16  # output rows per parallel task
# Software prefetch distance along a weight row. A hint on top of the hardware prefetcher:
# from DRAM it gave +0..40% at N = 2..4 and never lost, in A/B runs on the noisy dev box.
PREFETCH_BYTES = 1024


def _wide_registers() -> bool:
    """True where 32 vector registers hold 16+ lanes each (AVX-512): verify products (N >= 4)
    then use tiles of up to 5 activation rows x 2 weight rows (20 accumulator registers).
    Elsewhere (NEON: 4 lanes per register) tiles are at most 2 rows x 1 weight row (16 of the
    32 registers). MERLIN_QTILE=wide|narrow overrides it to read or test the other machine's
    code (debugging only: use a separate NUMBA_CACHE_DIR, the on-disk cache does not key on
    it). The arithmetic of each output is the same for every tile shape."""
    forced = os.environ.get("MERLIN_QTILE", "")
    if forced in ("wide", "narrow"):
        return forced == "wide"
    return platform.machine().lower() in ("x86_64", "amd64")


_WIDE = _wide_registers()


# --------------------------------------------------------------------------- low level


@intrinsic
def stack_f32(typingctx, n):
    """A float32 scratch of literal size n on the stack (entry-block alloca): LLVM promotes it
    to registers. A heap array here would be hoisted by Numba out of the parallel loop, shared
    by the tasks of a thread and kept in memory."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    size = n.literal_value

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.ArrayType(ir.FloatType(), size))
        slot.align = 64
        return builder.bitcast(slot, ir.PointerType(ir.FloatType()))

    return types.CPointer(types.float32)(n), codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint to bring the cache line of arr.flat[idx] into L1 (llvm.prefetch: prefetcht0 on
    x86, prfm pldl1keep on aarch64). Never faults, also past the end of the array."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@intrinsic
def scale_to_f32(typingctx, v):
    """A block scale as float32: uint16 holds bfloat16 bits (a shift and a bit cast,
    vectorisable everywhere); float32 passes through."""
    if isinstance(v, types.Float) and v.bitwidth == 32:

        def identity(context, builder, signature, args):
            return args[0]

        return types.float32(v), identity
    if not (isinstance(v, types.Integer) and v.bitwidth == 16):
        return None

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(v), codegen


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _hsum32(a, off):
    """Sum of a[off : off + 32] in a fixed pairwise order."""
    t0 = (a[off + 0] + a[off + 16]) + (a[off + 8] + a[off + 24])
    t1 = (a[off + 1] + a[off + 17]) + (a[off + 9] + a[off + 25])
    t2 = (a[off + 2] + a[off + 18]) + (a[off + 10] + a[off + 26])
    t3 = (a[off + 3] + a[off + 19]) + (a[off + 11] + a[off + 27])
    t4 = (a[off + 4] + a[off + 20]) + (a[off + 12] + a[off + 28])
    t5 = (a[off + 5] + a[off + 21]) + (a[off + 13] + a[off + 29])
    t6 = (a[off + 6] + a[off + 22]) + (a[off + 14] + a[off + 30])
    t7 = (a[off + 7] + a[off + 23]) + (a[off + 15] + a[off + 31])
    return ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7))


# --------------------------------------------------------------------------- q8, small N


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _q8_tile(x, n0, nr, qs, scales, oa, ob, nw, out):
    """out[n0:n0+nr, (oa, ob)[:nw]] for nr <= 5 activation rows and nw <= 2 weight rows
    (constants after inlining, so every loop but the block loop unrolls and `j` vectorises).
    ob == oa is allowed: the row is then computed twice, identically."""
    k_dim = qs.shape[1]
    acc = carray(stack_f32(320), 320)  # [nr][nw][32] lane accumulators
    s = carray(stack_f32(2), 2)
    for i in range(nr * nw * BLOCK):
        acc[i] = 0.0
    for b in range(k_dim // BLOCK):
        k0 = b * BLOCK
        for r in range(nw):
            o = oa if r == 0 else ob
            s[r] = scale_to_f32(scales[o, b])
            prefetch(qs, o * k_dim + k0 + PREFETCH_BYTES)
        for j in range(BLOCK):
            for r in range(nw):
                w = np.float32(qs[oa if r == 0 else ob, k0 + j]) * s[r]
                for n in range(nr):
                    acc[(n * nw + r) * BLOCK + j] += x[n0 + n, k0 + j] * w
    for n in range(nr):
        for r in range(nw):
            out[n0 + n, oa if r == 0 else ob] = _hsum32(acc, (n * nw + r) * BLOCK)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _q8_rows(x, qs, scales, oa, ob, out):
    """All activation rows against weight row oa (and ob, for verify products on wide
    registers): each weight block is read from memory once and converted once per tile.
    Verify products (N >= 4) on wide registers: tiles of 5 (then 4) activation rows x both
    weight rows share each x load between two rows. The rest, and all of a decode or short
    verify, go one weight row at a time, which streams best from DRAM (measured: N = 1 at
    2 weight rows ran at 1/2 to 1/3 of the speed). Each tile shape is inlined once."""
    n_rows = x.shape[0]
    n0 = 0
    pair = _WIDE and n_rows >= 4
    if pair:
        while n0 + 5 <= n_rows:
            _q8_tile(x, n0, 5, qs, scales, oa, ob, 2, out)
            n0 += 5
        if n_rows - n0 == 4:
            _q8_tile(x, n0, 4, qs, scales, oa, ob, 2, out)
            n0 += 4
    for r in range(2 if pair else 1):
        o = oa if r == 0 else ob
        if _WIDE:
            rest = n_rows - n0
            if rest == 3:
                _q8_tile(x, n0, 3, qs, scales, o, o, 1, out)
            elif rest == 2:
                _q8_tile(x, n0, 2, qs, scales, o, o, 1, out)
            elif rest == 1:
                _q8_tile(x, n0, 1, qs, scales, o, o, 1, out)
        else:
            m0 = n0
            while m0 + 2 <= n_rows:
                _q8_tile(x, m0, 2, qs, scales, o, o, 1, out)
                m0 += 2
            if m0 < n_rows:
                _q8_tile(x, m0, 1, qs, scales, o, o, 1, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q8(x, qs, scales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k] with w in q8.
    x: [N, K] f32 C-contiguous; qs: int8 [O, K]; scales: uint16 [O, K // 32] (bf16 bits, or
    float32); out: [N, O] f32. K must be a multiple of 32."""
    n_rows, k_dim = x.shape
    n_out = qs.shape[0]
    if qs.shape[1] != k_dim or scales.shape[1] * BLOCK != k_dim or scales.shape[0] != n_out:
        raise ValueError("matmul_q8: shapes of x, qs and scales do not match")
    if out.shape[0] != n_rows or out.shape[1] != n_out:
        raise ValueError("matmul_q8: out must be [N, O]")
    step = 2 if _WIDE and n_rows >= 4 else 1
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(n_tasks):
        o_end = min(n_out, (task + 1) * ROWS_PER_TASK)
        for o in range(task * ROWS_PER_TASK, o_end, step):
            _q8_rows(x, qs, scales, o, min(o + 1, o_end - 1), out)


# --------------------------------------------------------------------------- q4, small N


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _q4_tile(x, n0, nr, qs, scales, oa, ob, nw, out):
    """q4 twin of _q8_tile: the 16 bytes of a block give lanes 0..15 (low nibbles) and
    16..31 (high nibbles). The weight is (u - 8) * s for the stored nibble u, computed as
    fma(u, s, -8 s): one rounding of the exact value, so it equals float32((u - 8) * s)."""
    half = BLOCK // 2
    row_bytes = qs.shape[1]
    acc = carray(stack_f32(320), 320)  # [nr][nw][32] lane accumulators
    s = carray(stack_f32(2), 2)
    m = carray(stack_f32(2), 2)
    for i in range(nr * nw * BLOCK):
        acc[i] = 0.0
    for b in range(row_bytes // half):
        k0 = b * BLOCK
        for r in range(nw):
            o = oa if r == 0 else ob
            s[r] = scale_to_f32(scales[o, b])
            m[r] = np.float32(-8.0) * s[r]
            prefetch(qs, o * row_bytes + b * half + PREFETCH_BYTES)
        for j in range(half):
            for r in range(nw):
                # int32 casts keep the nibble arithmetic in 32-bit lanes (Numba widens)
                byte = np.int32(qs[oa if r == 0 else ob, b * half + j])
                w_lo = np.float32(np.int32(byte & 15)) * s[r] + m[r]
                w_hi = np.float32(np.int32(byte >> 4)) * s[r] + m[r]
                for n in range(nr):
                    a = (n * nw + r) * BLOCK + j
                    acc[a] += x[n0 + n, k0 + j] * w_lo
                    acc[a + half] += x[n0 + n, k0 + half + j] * w_hi
    for n in range(nr):
        for r in range(nw):
            out[n0 + n, oa if r == 0 else ob] = _hsum32(acc, (n * nw + r) * BLOCK)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _q4_rows(x, qs, scales, oa, ob, out):
    """q4 twin of _q8_rows."""
    n_rows = x.shape[0]
    n0 = 0
    pair = _WIDE and n_rows >= 4
    if pair:
        while n0 + 5 <= n_rows:
            _q4_tile(x, n0, 5, qs, scales, oa, ob, 2, out)
            n0 += 5
        if n_rows - n0 == 4:
            _q4_tile(x, n0, 4, qs, scales, oa, ob, 2, out)
            n0 += 4
    for r in range(2 if pair else 1):
        o = oa if r == 0 else ob
        if _WIDE:
            rest = n_rows - n0
            if rest == 3:
                _q4_tile(x, n0, 3, qs, scales, o, o, 1, out)
            elif rest == 2:
                _q4_tile(x, n0, 2, qs, scales, o, o, 1, out)
            elif rest == 1:
                _q4_tile(x, n0, 1, qs, scales, o, o, 1, out)
        else:
            m0 = n0
            while m0 + 2 <= n_rows:
                _q4_tile(x, m0, 2, qs, scales, o, o, 1, out)
                m0 += 2
            if m0 < n_rows:
                _q4_tile(x, m0, 1, qs, scales, o, o, 1, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q4(x, qs, scales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k] with w in q4.
    x: [N, K] f32 C-contiguous; qs: uint8 [O, K // 2]; scales: uint16 [O, K // 32] (bf16
    bits, or float32); out: [N, O] f32. K must be a multiple of 32."""
    n_rows, k_dim = x.shape
    n_out = qs.shape[0]
    if qs.shape[1] * 2 != k_dim or scales.shape[1] * BLOCK != k_dim or scales.shape[0] != n_out:
        raise ValueError("matmul_q4: shapes of x, qs and scales do not match")
    if out.shape[0] != n_rows or out.shape[1] != n_out:
        raise ValueError("matmul_q4: out must be [N, O]")
    step = 2 if _WIDE and n_rows >= 4 else 1
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(n_tasks):
        o_end = min(n_out, (task + 1) * ROWS_PER_TASK)
        for o in range(task * ROWS_PER_TASK, o_end, step):
            _q4_rows(x, qs, scales, o, min(o + 1, o_end - 1), out)


# --------------------------------------------------------------------------- dequantize


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def dequantize_q8_rows(qs, scales, o0, out):
    """out[i, :] = f32 weight row o0 + i of a q8 matrix, for i < out.shape[0].
    qs: int8 [O, K]; scales: uint16 (bf16) or f32 [O, K // 32]; out: [R, K] f32."""
    n, k_dim = out.shape
    if o0 < 0 or o0 + n > qs.shape[0] or qs.shape[1] != k_dim:
        raise ValueError("dequantize_q8_rows: rows or K out of range")
    for i in prange(n):
        o = o0 + i
        for b in range(k_dim // BLOCK):
            s = scale_to_f32(scales[o, b])
            for j in range(BLOCK):
                out[i, b * BLOCK + j] = np.float32(qs[o, b * BLOCK + j]) * s


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def dequantize_q4_rows(qs, scales, o0, out):
    """out[i, :] = f32 weight row o0 + i of a q4 matrix, for i < out.shape[0].
    qs: uint8 [O, K // 2]; scales: uint16 (bf16) or f32 [O, K // 32]; out: [R, K] f32.
    (u - 8) * s is exact before its one rounding, as in matmul_q4."""
    n, k_dim = out.shape
    if o0 < 0 or o0 + n > qs.shape[0] or qs.shape[1] * 2 != k_dim:
        raise ValueError("dequantize_q4_rows: rows or K out of range")
    half = BLOCK // 2
    for i in prange(n):
        o = o0 + i
        for b in range(k_dim // BLOCK):
            s = scale_to_f32(scales[o, b])
            for j in range(half):
                byte = np.int32(qs[o, b * half + j])
                out[i, b * BLOCK + j] = np.float32(np.int32((byte & 15) - 8)) * s
                out[i, b * BLOCK + half + j] = np.float32(np.int32((byte >> 4) - 8)) * s


# --------------------------------------------------------------------------- prefill


# f32 weights dequantized per BLAS call: big tiles keep sgemm efficient (the dequantization
# itself costs ~1% of the product at N = 512); 16 MB is 2048 rows at K = 2048.
PREFILL_TILE_FLOATS = 1 << 22


def prefill_tile_rows(n_out: int, k_dim: int) -> int:
    """Output rows per prefill tile (the scratch a caller provides holds rows * K floats):
    at most PREFILL_TILE_FLOATS / K, and the tiles of a matrix equal in size (a small last
    tile runs BLAS at a poor shape)."""
    most = max(1, min(n_out, PREFILL_TILE_FLOATS // max(k_dim, 1)))
    n_tiles = -(-n_out // most)
    return -(-n_out // n_tiles)


def _prefill(dequant_rows, x, qs, scales, out, scratch):
    n_out = scales.shape[0]
    k_dim = x.shape[1]
    rows = prefill_tile_rows(n_out, k_dim)
    if scratch is None or scratch.size < rows * k_dim:
        scratch = np.empty(rows * k_dim, np.float32)
    tile = scratch.reshape(-1)[: rows * k_dim].reshape(rows, k_dim)
    for o0 in range(0, n_out, rows):
        o1 = min(n_out, o0 + rows)
        w = tile[: o1 - o0]
        dequant_rows(qs, scales, o0, w)
        np.matmul(x, w.T, out=out[:, o0:o1])


def matmul_q8_prefill(x, qs, scales, out, scratch=None):
    """out = x @ w.T for large N: tiles of prefill_tile_rows(O, K) weight rows are dequantized
    to f32 (into `scratch`, >= that many rows * K floats, allocated if None) and multiplied by
    NumPy's BLAS (out[:, tile] is written in place). x: [N, K] f32, out: [N, O] f32."""
    _prefill(dequantize_q8_rows, x, qs, scales, out, scratch)


def matmul_q4_prefill(x, qs, scales, out, scratch=None):
    """q4 twin of matmul_q8_prefill."""
    _prefill(dequantize_q4_rows, x, qs, scales, out, scratch)


# --------------------------------------------------------------------------- reference twins


def _scales_ref(scales):
    s = np.asarray(scales)
    if s.dtype == np.uint16:
        s = (s.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return s.astype(np.float64)


def dequantize_q8_reference(qs, scales):
    """Naive twin of dequantize_q8_rows over all rows, float64 [O, K]."""
    o = qs.shape[0]
    q = qs.astype(np.float64).reshape(o, -1, BLOCK)
    return (q * _scales_ref(scales)[:, :, None]).reshape(o, -1)


def dequantize_q4_reference(qs, scales):
    """Naive twin of dequantize_q4_rows over all rows, float64 [O, K]."""
    o = qs.shape[0]
    b = qs.reshape(o, -1, BLOCK // 2)
    u = np.concatenate([b & 15, b >> 4], axis=2).astype(np.float64) - 8.0
    return (u * _scales_ref(scales)[:, :, None]).reshape(o, -1)


def matmul_q8_reference(x, qs, scales):
    """Naive twin of matmul_q8 / matmul_q8_prefill: dequantize, float64 product."""
    return (x.astype(np.float64) @ dequantize_q8_reference(qs, scales).T).astype(np.float32)


def matmul_q4_reference(x, qs, scales):
    """Naive twin of matmul_q4 / matmul_q4_prefill: dequantize, float64 product."""
    return (x.astype(np.float64) @ dequantize_q4_reference(qs, scales).T).astype(np.float32)
