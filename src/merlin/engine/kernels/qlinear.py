"""Row-major q8_0 weight products: the q8 kernel where the grouped one (qgroup.py) is not
the faster (qgroup.Q8_GROUPED false), and the q8 prefill through BLAS.

Format (engine/quant.py; C-contiguous, row-major like the f32 weight [O, K]):

    qs int8 [O, K], scales uint16 [O, K // 32] (bfloat16 bits; float32 scale arrays work too)
    weight = qs[o, k] * scale(o, k // 32)

Small N (decode, verify; `matmul_q8`, parallel over tasks of 16 output rows): activations
quantized per block to int16 (actquant.py), each block an exact integer dot into LANES int32
lanes, scaled once:

    acc[l] = fma(float(sum of the products in lane l of block b), sw[o, b] * dx[n, b], acc[l])
    out[n, o] = fixed pairwise tree over the LANES lanes

in register tiles of TILE_ROWS activation rows x TILE_OUT weight rows (x86: 4 x 4 for calls of
WIDE_FROM or more rows, else 4 x 1: four weight streams at once halved a decode step's DRAM
bandwidth; aarch64 and generic 3 x 1). The tile shape never changes the operations of one
output, so row n of an N-row call is bitwise equal to a 1-row call, for any N and thread count.

Large N (prefill; `matmul_q8_prefill`): equal tiles of output rows dequantized to f32 and
multiplied by NumPy's BLAS (`prefill_product`); BLAS sums in its own order, so these rows are
not bitwise equal to decode rows. Twins for tests: reference.py. Measurements: docs/kernels.md.
"""

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange
from numba.core import types
from numba.extending import intrinsic

from .actquant import quantize_activations
from .irtools import (
    BLOCK,
    F32,
    I8,
    I32,
    QFASTMATH,
    array_ptr,
    call,
    load_vector,
    pick,
    prefetch,
    scale_to_f32,
    splat,
    stack_f32,
    vec,
)
from .target import TARGET

ROWS_PER_TASK = 16  # output rows per parallel task
# software prefetch distance along a weight row (a hint on top of the hardware prefetcher)
PREFETCH_BYTES = 1024
# x86: adjacent-pair sums that LLVM makes vpmaddwd (+ vpdpwssd with VNNI); elsewhere LLVM's
# partial reduction (smull/smlal on aarch64)
_X86_IR = TARGET.x86_ir
LANES = 8  # int32 lanes per block dot (256-bit: a 512-bit op is two slots on Zen 4)
XQ8_DTYPE = np.int16  # int8 activations cost q8 1.5 points of top-1 agreement
# register tile: TILE_ROWS activation rows x TILE_OUT weight rows, one accumulator each
TILE_ROWS = 4 if _X86_IR else 3
TILE_OUT = 4 if _X86_IR else 1
WIDE_FROM = 3  # calls with fewer activation rows tile over one weight row
SCALE_CHUNK = 64  # blocks whose scales are made at once (stack scratch)
ACC_FLOATS = TILE_OUT * TILE_ROWS * LANES
SCALE_FLOATS = TILE_OUT * TILE_ROWS * SCALE_CHUNK


# --------------------------------------------------------------------------- block dot


def _int_lanes(builder, w, x):
    """<32 x i8> weights times <32 x i16> activations -> <LANES x i32> partial sums, exact.
    x86: lane l sums products 2l, 2l + 1, 16 + 2l, 16 + 2l + 1 (LLVM: two 256-bit vpmaddwd,
    the second fused with the add into vpdpwssd with VNNI); elsewhere LLVM's partial
    reduction (smull/smlal on aarch64)."""
    if _X86_IR:
        v16 = vec(I32, 16)
        sums = []
        for h in (0, 1):
            half = range(16 * h, 16 * h + 16)
            prod = builder.mul(
                builder.sext(pick(builder, w, half), v16), builder.sext(pick(builder, x, half), v16)
            )
            even, odd = pick(builder, prod, range(0, 16, 2)), pick(builder, prod, range(1, 16, 2))
            sums.append(builder.add(even, odd))
        return builder.add(sums[1], sums[0])
    v32 = vec(I32, 32)
    prod = builder.mul(builder.sext(w, v32), builder.sext(x, v32))
    lanes = vec(I32, LANES)
    name = f"llvm.vector.partial.reduce.add.v{LANES}i32.v32i32"
    return call(builder, name, lanes, [ir.Constant(lanes, None), prod])


def _fma_into(builder, acc, lane0, ints, scale):
    """acc[lane0 : lane0 + LANES] = fma(float(ints), scale, acc[...]) (one rounding)."""
    vf = vec(F32, LANES)
    ptr = builder.bitcast(builder.gep(acc, [lane0]), vf.as_pointer())
    args = [builder.sitofp(ints, vf), splat(builder, scale, vf), builder.load(ptr)]
    builder.store(call(builder, f"llvm.fma.v{LANES}f32", vf, args), ptr)


@intrinsic
def q8_block_dot(typingctx, acc, lane0, qs, qi, xq, xi, scale):
    """acc[lane0:lane0+LANES] += float(int lanes of w-block . x-block) * scale, where the 32
    int8 weights of the block start at qs.flat[qi] and its activations at xq.flat[xi]."""

    def codegen(context, builder, signature, args):
        acc_ptr, lane0_v, qs_v, qi_v, xq_v, xi_v, scale_v = args
        w = load_vector(builder, array_ptr(context, builder, signature.args[2], qs_v, qi_v), I8, 32)
        x_elem = ir.IntType(signature.args[4].dtype.bitwidth)
        x_ptr = array_ptr(context, builder, signature.args[4], xq_v, xi_v)
        x = load_vector(builder, x_ptr, x_elem, 32)
        _fma_into(builder, acc_ptr, lane0_v, _int_lanes(builder, w, x), scale_v)
        return context.get_dummy_value()

    return types.void(acc, lane0, qs, qi, xq, xi, scale), codegen


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _hsum_lanes(a, off):
    """Sum of a[off : off + 8] in a fixed pairwise order."""
    return ((a[off + 0] + a[off + 4]) + (a[off + 2] + a[off + 6])) + (
        (a[off + 1] + a[off + 5]) + (a[off + 3] + a[off + 7])
    )


# --------------------------------------------------------------------------- small N


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _block(x_q, sc, n0, nr, qs, o0, no, b, c0, acc_ptr):
    """Weight block b of rows o0 .. o0 + no - 1 against activation rows n0 .. n0 + nr - 1,
    into their accumulators (nr and no are constants after inlining: the loops unroll and the
    accumulators stay in registers). sc holds the scale products of the chunk from block c0."""
    k_dim = x_q.shape[1]
    row_bytes = qs.shape[1]
    # past a row's end the prefetch goes on into the same row of the next tile (read first
    # there), not into the next row, which this tile is reading already
    ahead = b * BLOCK + PREFETCH_BYTES
    if ahead >= row_bytes:
        ahead += (no - 1) * row_bytes
    for j in range(no):
        prefetch(qs, (o0 + j) * row_bytes + ahead)
    for n in range(nr):
        xi = (n0 + n) * k_dim + b * BLOCK
        for j in range(no):
            qi = (o0 + j) * row_bytes + b * BLOCK
            t = j * TILE_ROWS + n
            s = sc[np.uint64(t * SCALE_CHUNK + b - c0)]
            q8_block_dot(acc_ptr, t * LANES, qs, qi, x_q, xi, s)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _tile(x_q, dx, n0, nr, qs, scales, o0, no, out):
    """out[n0 : n0 + nr, o0 : o0 + no] for nr <= TILE_ROWS activation rows and no <= TILE_OUT
    weight rows: each weight block is loaded and unpacked once for all nr activation rows,
    each activation block once for all no weight rows. Scales (weight scale x activation
    scale) are made a chunk of blocks at a time by a vectorised loop, outside the block loop."""
    k_dim = x_q.shape[1]
    n_blocks = k_dim // BLOCK
    acc_ptr = stack_f32(ACC_FLOATS)
    acc = carray(acc_ptr, ACC_FLOATS)
    sc = carray(stack_f32(SCALE_FLOATS), SCALE_FLOATS)
    for i in range(ACC_FLOATS):
        acc[i] = 0.0
    for c0 in range(0, n_blocks, SCALE_CHUNK):
        c1 = min(n_blocks, c0 + SCALE_CHUNK)
        for j in range(no):
            for n in range(nr):
                # unsigned indices: no negative-index wraparound code, so this loop vectorises
                srow = scales[np.uint64(o0 + j)]
                drow = dx[np.uint64(n0 + n)]
                t = np.uint64((j * TILE_ROWS + n) * SCALE_CHUNK)
                for b in range(c0, c1):
                    i = np.uint64(b)
                    sc[t + i - np.uint64(c0)] = scale_to_f32(srow[i]) * drow[i]
        for b in range(c0, c1):
            _block(x_q, sc, n0, nr, qs, o0, no, b, c0, acc_ptr)
    for j in range(no):
        for n in range(nr):
            out[n0 + n, o0 + j] = _hsum_lanes(acc, (j * TILE_ROWS + n) * LANES)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _tiles(x_q, dx, qs, scales, o0, no, out):
    """All activation rows against weight rows o0 .. o0 + no - 1: tiles of TILE_ROWS, then
    the rest (each size a separate unrolled copy)."""
    n_rows = x_q.shape[0]
    n0 = 0
    while n0 + TILE_ROWS <= n_rows:
        _tile(x_q, dx, n0, TILE_ROWS, qs, scales, o0, no, out)
        n0 += TILE_ROWS
    rest = n_rows - n0
    if rest == 3:
        _tile(x_q, dx, n0, 3, qs, scales, o0, no, out)
    elif rest == 2:
        _tile(x_q, dx, n0, 2, qs, scales, o0, no, out)
    elif rest == 1:
        _tile(x_q, dx, n0, 1, qs, scales, o0, no, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q8(x, qs, scales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k] with w in q8 and x quantized to q8_0 here.
    x: [N, K] f32 C-contiguous; qs: int8 [O, K]; scales: uint16 [O, K // 32] (bf16 bits, or
    float32); out: [N, O] f32. K must be a multiple of 32."""
    n_rows, k_dim = x.shape
    n_out = qs.shape[0]
    if qs.shape[1] != k_dim or scales.shape[1] * BLOCK != k_dim or scales.shape[0] != n_out:
        raise ValueError("matmul_q8: shapes of x, qs and scales do not match")
    if out.shape[0] != n_rows or out.shape[1] != n_out:
        raise ValueError("matmul_q8: out must be [N, O]")
    x_q = np.empty((n_rows, k_dim), XQ8_DTYPE)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    quantize_activations(x, x_q, dx)
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    wide = TILE_OUT > 1 and n_rows >= WIDE_FROM
    for task in prange(n_tasks):
        end = min(n_out, (task + 1) * ROWS_PER_TASK)
        o0 = task * ROWS_PER_TASK
        if wide:
            while o0 + TILE_OUT <= end:
                _tiles(x_q, dx, qs, scales, o0, TILE_OUT, out)
                o0 += TILE_OUT
        while o0 < end:
            _tiles(x_q, dx, qs, scales, o0, 1, out)
            o0 += 1


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


def prefill_product(dequant_rows, x, qs, scales, out, scratch):
    """out = x @ w.T by tiles of prefill_tile_rows(O, K) weight rows, O = out.shape[1]:
    dequant_rows(qs, scales, o0, tile) makes rows o0.. of w in f32 (into `scratch` if it holds
    that many rows * K floats, else a new buffer), NumPy's BLAS writes out[:, tile] in place."""
    n_out = out.shape[1]
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
    """out = x @ w.T for large N, w in q8: prefill_product over dequantize_q8_rows (scratch:
    prefill_tile_rows(O, K) * K floats, allocated if None). x: [N, K] f32, out: [N, O] f32."""
    prefill_product(dequantize_q8_rows, x, qs, scales, out, scratch)
