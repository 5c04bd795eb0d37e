"""q4_0 weights in groups of 8 output rows, for decode and speculative verify (small N).

Layout (made by pack_q4_groups from the row-major q4 of engine/quant.py; a matrix whose row
count is not a multiple of 8 gets zero rows appended to its last group):

    packed  uint8  [O / 8, K / 32, 128]   block b of the 8 rows of group g, 4 slices of 32
                                          bytes: byte 4r + i of slice j holds weight 4j + i of
                                          row r in its low nibble and weight 16 + 4j + i in its
                                          high nibble, each stored as q + 8 (q in -8..7)
    gscales uint16 [O / 8, K / 32, 8]     the 8 rows' bf16 scales of block b

Why: the row-major kernel (engine/kernels/qlinear.py: q8, and q4 until this replaced it) gives
every (activation row, weight row) its own lane accumulators and pays, per block, an int dot, a
conversion and an fma for each pair. Here one 32-byte slice is 4 weights of 8 rows, so an
integer dot-product instruction (x86 vpdpbusd, aarch64 sdot: 4 byte products summed into each
32-bit lane) with 4 activations broadcast to every lane adds up 8 rows at once; after 8 of them
each lane holds its row's whole block dot, and the conversion, the scale (a vector of 8 row
scales) and the fma are shared by the 8 rows. The weights stay unsigned nibbles (no sign
extension); the -8 is taken out exactly by starting each block's accumulator at -8 x (sum of the
block's activations). In cache, one thread, 256 x 2048 (dev box, Zen 4, min of 7 x 200 calls,
against the row-major q4 kernel it replaced, in the same process): N = 1 10.2 us vs 24.6, N = 2
15.0 vs 35.6, N = 5 34.0 vs 88.8, N = 8 50.5 vs 139.2. From DRAM, 2 threads, 2B shapes, host
busy: N = 1 1.3-1.4x, N = 5 2.1-2.3x.

Assembly (inspect_asm): x86-64 znver4, per block and activation row 8 vpdpbusd ymm (two chains) with
the 4 activations broadcast from memory, then one vcvtdq2ps, vmulps and vfmadd for the 8 rows;
the nibbles (vpand, vgf2p8affineqb for the shift) are unpacked once per block for all rows.
aarch64 cortex-a76 (qemu, the arm64 root of packaging/test-arm64.sh): per block and row 16
sdot (two 4-lane halves) with ld1r broadcasts, and/ushr for the nibbles, 2 scvtf, 2 fmul,
2 fmla; checked there against the twin, rows equal to 1-row calls.

q8 stays row-major: the same grouping for q8 with int16 activations (16 rows, vpdpwssd zmm,
2 weights x 16 rows per instruction) ran 1.46x faster at N = 1 in cache but 0.75-0.9x at
N = 2-3 from DRAM on the 2B shapes (Zen 4 retires fewer int16 than int8 products per cycle),
and int8 activations cost q8 its quality target (96.5% top-1 agreement, not 97%).

Activations are quantized per block of 32 to int8 (absmax / 127, as llama.cpp does for q4_0);
every product is an exact integer, and per (n, o) the float operations are the same sequence
fma(float(dot_b) * dx[n, b], w_scale[o, b], acc) for b = 0, 1, ... whatever N, the tile or the
thread count: row n of an N-row call is bitwise equal to a 1-row call.

Dot instructions: x86 with VNNI (AVX512-VNNI or AVX-VNNI, as qlinear decides): vpdpbusd ymm;
aarch64 with the dot-product extension: sdot (llvm.aarch64.neon.sdot); anywhere else (and with
MERLIN_QKERNEL=generic, to test it here) the same sums written as plain LLVM vector IR.
"""

import os
import platform

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from .qlinear import (
    _VNNI,
    _X86,
    BLOCK,
    PREFETCH_BYTES,
    QFASTMATH,
    _scales_ref,
    _small_n_reference,
    _target_features,
    prefetch,
    prefill_product,
    quantize_activations,
    scale_to_f32,
    stack_f32,
)

GROUP = 8  # output rows per group: 8 int32 lanes
SLICE = 32  # bytes per slice: 4 weights of each of the 8 rows
GROUP_BLOCK_BYTES = 4 * SLICE  # one block (32 weights) of 8 rows
TILE_ROWS = 4  # activation rows per register tile (4 x 8 lanes of accumulators)
ACC_FLOATS = TILE_ROWS * GROUP


def _dot_kind() -> str:
    """Which dot instruction the kernels are built for, on the CPU Numba compiles for."""
    if os.environ.get("MERLIN_QKERNEL", "") == "generic":
        return "generic"
    if _X86:
        return "vnni" if _VNNI else "generic"
    arm = platform.machine().lower() in ("aarch64", "arm64")
    return "sdot" if arm and "+dotprod" in _target_features().split(",") else "generic"


DOT = _dot_kind()
_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V8I32 = ir.VectorType(_I32, 8)
_V32I8 = ir.VectorType(_I8, 32)
_V8F = ir.VectorType(_F32, 8)


def _splat(builder, value, vec):
    first = builder.insert_element(ir.Constant(vec, None), value, _I32(0))
    return builder.shuffle_vector(first, first, ir.Constant(ir.VectorType(_I32, vec.count), None))


def _dot4(builder, acc, w, xword):
    """acc[r] + sum_i w[4r + i] * x[i] for 8 lanes r: w <32 x i8> unsigned nibbles, xword the 4
    activations (int8) packed in an i32."""
    xs = builder.bitcast(_splat(builder, xword, _V8I32), _V32I8)
    if DOT == "vnni":
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(_V8I32, [_V8I32, _V32I8, _V32I8]),
            "llvm.x86.avx512.vpdpbusd.256",
        )
        return builder.call(fn, [acc, w, xs])
    if DOT == "sdot":
        v4, v16 = ir.VectorType(_I32, 4), ir.VectorType(_I8, 16)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(v4, [v4, v16, v16]),
            "llvm.aarch64.neon.sdot.v4i32.v16i8",
        )
        halves = []
        for h in range(2):
            lanes = ir.Constant(ir.VectorType(_I32, 4), list(range(4 * h, 4 * h + 4)))
            bytes_ = ir.Constant(ir.VectorType(_I32, 16), list(range(16 * h, 16 * h + 16)))
            a = builder.shuffle_vector(acc, acc, lanes)
            halves.append(
                builder.call(
                    fn,
                    [
                        a,
                        builder.shuffle_vector(w, w, bytes_),
                        builder.shuffle_vector(xs, xs, bytes_),
                    ],
                )
            )
        return builder.shuffle_vector(halves[0], halves[1], ir.Constant(_V8I32, list(range(8))))
    v32 = ir.VectorType(_I32, 32)
    prod = builder.mul(builder.zext(w, v32), builder.sext(xs, v32))
    for i in range(4):
        pick = ir.Constant(_V8I32, list(range(i, 32, 4)))
        acc = builder.add(acc, builder.shuffle_vector(prod, prod, pick))
    return acc


@intrinsic
def group_block(typingctx, acc, lane0, packed, pi, xq, xi, corr, gscales, si, dx):
    """acc[lane0 : lane0 + 8] = fma(float(dot - corr) * dx, scales, acc): the block dot of the
    8 rows of one group (packed.flat[pi:], 128 bytes) with the 32 int8 activations at
    xq.flat[xi:]; corr = 8 x their sum; scales: the 8 bf16 at gscales.flat[si:]."""
    if not (isinstance(gscales, types.Array) and gscales.dtype == types.uint16):
        return None  # the scales are read as bf16 bits

    def codegen(context, builder, signature, args):
        acc_p, lane0_v, packed_v, pi_v, xq_v, xi_v, corr_v, gs_v, si_v, dx_v = args
        sig = signature.args
        w_base = builder.gep(context.make_array(sig[2])(context, builder, packed_v).data, [pi_v])
        x_base = builder.gep(context.make_array(sig[4])(context, builder, xq_v).data, [xi_v])
        x_words = builder.bitcast(x_base, _I32.as_pointer())
        # two chains of dot instructions (low and high nibbles), added at the end: one chain
        # of 8 waits on each instruction's latency (2 chains: 15% faster in cache, 4: no more)
        chains = [
            _splat(builder, builder.sub(_I32(0), corr_v), _V8I32),
            ir.Constant(_V8I32, [0] * 8),
        ]
        low = ir.Constant(_V32I8, [15] * 32)
        for j in range(4):
            ptr = builder.gep(w_base, [ir.Constant(pi_v.type, SLICE * j)])
            w = builder.load(builder.bitcast(ptr, _V32I8.as_pointer()), align=1)
            for c, (nibbles, word) in enumerate(
                (
                    (builder.and_(w, low), j),
                    (builder.lshr(w, ir.Constant(_V32I8, [4] * 32)), 4 + j),
                )
            ):
                xword = builder.load(builder.gep(x_words, [_I32(word)]), align=1)
                chains[c] = _dot4(builder, chains[c], nibbles, xword)
        dot = builder.add(chains[0], chains[1])
        s_ptr = builder.gep(context.make_array(sig[7])(context, builder, gs_v).data, [si_v])
        v8i16 = ir.VectorType(ir.IntType(16), 8)
        bits = builder.load(builder.bitcast(s_ptr, v8i16.as_pointer()), align=2)
        wide = builder.shl(builder.zext(bits, _V8I32), ir.Constant(_V8I32, [16] * 8))
        scales = builder.bitcast(wide, _V8F)
        scaled = builder.fmul(builder.sitofp(dot, _V8F), _splat(builder, dx_v, _V8F))
        a_ptr = builder.bitcast(builder.gep(acc_p, [lane0_v]), _V8F.as_pointer())
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V8F, [_V8F, _V8F, _V8F]), "llvm.fma.v8f32"
        )
        builder.store(builder.call(fma, [scaled, scales, builder.load(a_ptr)]), a_ptr)
        return context.get_dummy_value()

    return types.void(acc, lane0, packed, pi, xq, xi, corr, gscales, si, dx), codegen


@njit(nogil=True, cache=True)
def _offset_sums(xq, corr):
    """corr[n, b] = 8 x sum of activation block b of row n (the nibbles' +8, taken out)."""
    for n in range(xq.shape[0]):
        for b in range(xq.shape[1] // BLOCK):
            s = np.int32(0)
            for j in range(BLOCK):
                s += np.int32(xq[n, b * BLOCK + j])
            corr[n, b] = 8 * s


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _tile(packed, gscales, xq, dx, corr, g, n0, nr, out):
    """out[n0 : n0 + nr, 8g : 8g + 8] (rows past out's width are padding, dropped)."""
    n_blocks = packed.shape[1]
    k_dim = xq.shape[1]
    acc_ptr = stack_f32(ACC_FLOATS)
    acc = carray(acc_ptr, ACC_FLOATS)
    for i in range(nr * GROUP):
        acc[i] = 0.0
    for b in range(n_blocks):
        pi = (g * n_blocks + b) * GROUP_BLOCK_BYTES
        prefetch(packed, pi + PREFETCH_BYTES)
        for n in range(nr):
            group_block(
                acc_ptr,
                n * GROUP,
                packed,
                pi,
                xq,
                (n0 + n) * k_dim + b * BLOCK,
                corr[n0 + n, b],
                gscales,
                (g * n_blocks + b) * GROUP,
                dx[n0 + n, b],
            )
    rows = min(GROUP, out.shape[1] - g * GROUP)
    for n in range(nr):
        for r in range(rows):
            out[n0 + n, g * GROUP + r] = acc[n * GROUP + r]


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q4g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q4 (pack_q4_groups), x quantized per
    block to int8 here. x: [N, K] f32 C-contiguous; out: [N, O] f32, O <= 8 x groups."""
    n_rows, k_dim = x.shape
    n_groups, n_blocks = packed.shape[0], packed.shape[1]
    if n_blocks * BLOCK != k_dim or packed.shape[2] != GROUP_BLOCK_BYTES:
        raise ValueError("matmul_q4g: x and the packed weights differ in K")
    if gscales.shape[0] != n_groups or gscales.shape[1] != n_blocks or gscales.shape[2] != GROUP:
        raise ValueError("matmul_q4g: scales do not match the packed weights")
    if out.shape[0] != n_rows or not n_groups * GROUP - GROUP < out.shape[1] <= n_groups * GROUP:
        raise ValueError("matmul_q4g: out must be [N, O]")
    xq = np.empty((n_rows, k_dim), np.int8)
    dx = np.empty((n_rows, n_blocks), np.float32)
    corr = np.empty((n_rows, n_blocks), np.int32)
    quantize_activations(x, xq, dx)
    _offset_sums(xq, corr)
    for g in prange(n_groups):
        n0 = 0
        while n0 + TILE_ROWS <= n_rows:
            _tile(packed, gscales, xq, dx, corr, g, n0, TILE_ROWS, out)
            n0 += TILE_ROWS
        rest = n_rows - n0
        if rest == 3:
            _tile(packed, gscales, xq, dx, corr, g, n0, 3, out)
        elif rest == 2:
            _tile(packed, gscales, xq, dx, corr, g, n0, 2, out)
        elif rest == 1:
            _tile(packed, gscales, xq, dx, corr, g, n0, 1, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def dequantize_q4g_rows(packed, gscales, o0, out):
    """out[i, :] = f32 weight row o0 + i of a grouped q4 matrix (prefill tiles, embedding
    rows); the same values as dequantize_q4_reference on the row-major q4 it was packed from."""
    n, k_dim = out.shape
    n_blocks = packed.shape[1]
    if o0 < 0 or o0 + n > packed.shape[0] * GROUP or n_blocks * BLOCK != k_dim:
        raise ValueError("dequantize_q4g_rows: rows or K out of range")
    for i in prange(n):
        g, r = divmod(o0 + i, GROUP)
        for b in range(n_blocks):
            s = scale_to_f32(gscales[g, b, r])
            for j in range(4):
                for c in range(4):
                    byte = np.int32(packed[g, b, SLICE * j + 4 * r + c])
                    out[i, b * BLOCK + 4 * j + c] = np.float32(np.int32((byte & 15) - 8)) * s
                    out[i, b * BLOCK + 16 + 4 * j + c] = np.float32(np.int32((byte >> 4) - 8)) * s


def matmul_q4g_prefill(x, packed, gscales, out, scratch=None):
    """out = x @ w.T for large N (prefill), as qlinear.matmul_q8_prefill: tiles of weight rows
    dequantized to f32 (into `scratch` if big enough) and multiplied by NumPy's BLAS."""
    prefill_product(dequantize_q4g_rows, x, packed, gscales, out, scratch)


def pack_q4_groups(qs: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-major q4 (engine/quant.py: qs uint8 [O, K/2], scales [O, K/32]) -> (packed, gscales)
    as in the module docstring. Rows are padded to a multiple of 8 with zero weights."""
    o, half = qs.shape
    n_blocks = half // 16
    groups = -(-o // GROUP)
    pad = groups * GROUP - o
    qs = np.concatenate([qs, np.full((pad, half), 0x88, np.uint8)]) if pad else qs
    scales = np.concatenate([scales, np.zeros((pad, n_blocks), scales.dtype)]) if pad else scales
    blocks = qs.reshape(groups, GROUP, n_blocks, 16)
    weights = np.concatenate([blocks & 15, blocks >> 4], axis=3)  # [G, 8, nb, 32] in order
    weights = weights.transpose(0, 2, 1, 3)  # [G, nb, 8 rows, 32]
    packed = np.empty((groups, n_blocks, 4, GROUP, 4), np.uint8)
    for j in range(4):
        low = weights[:, :, :, 4 * j : 4 * j + 4]
        high = weights[:, :, :, 16 + 4 * j : 16 + 4 * j + 4]
        packed[:, :, j] = low | (high << 4)
    gscales = np.ascontiguousarray(scales.reshape(groups, GROUP, n_blocks).transpose(0, 2, 1))
    return packed.reshape(groups, n_blocks, GROUP_BLOCK_BYTES), gscales


def dequantize_q4_reference(qs, scales):
    """Naive twin of dequantize_q4g_rows over all rows, on the row-major q4 (engine/quant.py)
    it was packed from: float64 [O, K]."""
    o = qs.shape[0]
    b = qs.reshape(o, -1, BLOCK // 2)
    u = np.concatenate([b & 15, b >> 4], axis=2).astype(np.float64) - 8.0
    return (u * _scales_ref(scales)[:, :, None]).reshape(o, -1)


def matmul_q4g_reference(x, qs, scales):
    """Naive twin of matmul_q4g on the row-major q4 it was packed from: activations quantized
    to int8 as there, float64 product."""
    return _small_n_reference(dequantize_q4_reference, np.int8, x, qs, scales)
