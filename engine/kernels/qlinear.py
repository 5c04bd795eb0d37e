"""Weight matrix products for block-quantized weights (q8_0, q4_0: one scale per 32 weights).

Formats (made by engine/quant.py; C-contiguous, row-major like the f32 weight [O, K]):

    q8: qs int8 [O, K]          weight = qs[o, k] * scale(o, k // 32)
    q4: qs uint8 [O, K // 2]    block b of row o is bytes 16b..16b+15; byte j holds weight
                                32b + j in its low nibble and weight 32b + 16 + j in its high
                                nibble, each stored as q + 8 (q in -8..7)
        scales uint16 [O, K // 32], bfloat16 bits (float32 scale arrays work too)

The model runs q4 through engine/kernels/qgroup.py (8 rows interleaved per integer dot
instruction, 2-2.5x faster in cache); the row-major q4 kernels here are no longer on its path
and stay, tested, only until they are removed. q8 runs here.

Small N (decode N = 1, speculative verify N = K + 1 <= 16): `matmul_q8` / `matmul_q4`,
parallel over output rows (16 per task). The activations are quantized per block of 32 too
(int16, scale absmax / 32767; int8 for q4 where the int dot multiplies bytes, see
XQ4_DTYPE) and each block is an exact integer dot product into 8 int32 lanes, scaled once:

    acc[l] = fma(float(sum of the products in lane l of block b), sw[o, b] * dx[n, b], acc[l])
    out[n, o] = fixed pairwise tree over the 8 lanes

The int dot is generic LLVM vector IR (intrinsics below), with one x86 intrinsic:
  x86, q8 (and q4 without VNNI): adjacent-pair sums of the two 16-weight halves, which LLVM
    turns into a 256-bit vpmaddwd plus vpdpwssd (VNNI; without, a second vpmaddwd and an
    add), x int16;
  x86 with AVX512-VNNI/AVX-VNNI, q4: llvm.x86.avx512.vpdpbusd.256 on the stored nibbles
    (unsigned, q + 8) and int8 x, 4 products per lane, each lane starting from -8 x (sum of
    its 4 activations), made once per activation row (`q4_offset_sums`): exact, and no -8 or
    sign extension per weight;
  elsewhere: llvm.vector.partial.reduce.add, which aarch64 turns into sdot (q4: int8 x int8)
    or smull/smlal (q8: int8 x int16).
Per activation row and weight block that is 4 vector ops for q8 (int dot 2, vcvtdq2ps,
vfmadd) and 3 for q4 with VNNI. 256-bit vectors, not 512: Zen 4 runs a 512-bit op as two
256-bit halves, so 16 lanes (a 512-bit vpmaddwd) cost as much as the two 256-bit int ops and
doubled the conversion and fma, 6 slots instead of 4.

A register tile is TILE_ROWS activation rows x TILE_OUT weight rows (4 x 4 on x86, 16
accumulators in registers): each weight block is loaded and unpacked once for its 4
activation rows, each activation block loaded once for its 4 weight rows. Tiles over one
weight row (the previous design) re-read the activations for every weight row: 64 bytes per
row and block for int16, from L1/L2, which held the verify at ~2.2 cycles per row and block
instead of the ~1.5 its vector ops need. But 4 weight rows read at once are 4 DRAM streams
per thread, and that halved the bandwidth of a decode step here (q8 N = 1 from DRAM: 11
instead of 22 G weights/s, 2 threads; prefetching on into the next tile did not restore
it): calls with fewer than WIDE_FROM = 3 activation rows, bandwidth-bound anyway,
tile over one weight row. The tile shape never changes the operations of one output, so
the choice keeps rows bitwise equal across N. Float weights before all that converted every
weight to f32 (4 vector ops per 16 weights) and made q4 compute-bound.

Measured with engine/qlinear_bench.py, this design against the previous one (16-lane
512-bit dots, one-weight-row tiles), runs interleaved, medians, GB/s of weight bytes:
  --threads 1 --in-cache (compute speed): q8 N = 1 25 vs 28 (the 1-row tiles lost a little),
    N = 5 9.3 vs 7.3; q4 N = 1 12.6 vs 11.9, N = 5 5.1 vs 3.4.
  --threads 2 (DRAM, Qwen3-VL-2B shapes): N = 5 1.2-1.7x faster for q8 and q4 (gate_up q8
    16.6 vs 14.0, q4 9.9 vs 7.1); N = 1 q4 1.2-1.3x (gate_up 25 vs 21 GB/s, 75% of the
    probed bandwidth), q8 N = 1 at 80-90% as before. The shared dev box moves the figures by
    2x from minute to minute: compare in one run.

Exact integer dots and no reassociation anywhere (FASTMATH without "reassoc") mean every
register tile performs the same float operations in the same order for a given (n, o): row n
of an N-row call is bitwise equal to a 1-row call on x[n], for any N and any thread count
(tests/test_quant.py checks N = 1..9 with 1 and 2 threads, for the x86 code with and without
VNNI and for the generic code). The cost of an extra activation row is its own int dot,
conversion and fma per block, so a verify of N rows is compute-bound sooner than a decode
step (V(4)/T ~2.5-2.7 in cache; from DRAM, 2 threads, 1.7-1.8 for q8 and 2.2-2.5 for q4).

Activation quantization error (int16: 1.5e-5 of the block's largest value) is far below the
weights' own; with int8 activations q8 agreed with f32 on 96.5% of tokens instead of 98.5%
(tests/test_quality.py), hence int16 for q8. q4 agreed on 71.0-71.5% with int8 activations
and vpdpbusd, 69.0% with int16 (demo model, decode path; the test asks 55%).

Stack scratch (`stack_f32`, an entry-block alloca) holds the accumulators: LLVM keeps them in
registers. A heap array there is hoisted by Numba out of the prange loop and shared by the
tasks of a thread; neighbouring threads' arrays then shared cache lines and a 2-thread call
took 8 ms instead of 1 ms. Scale products (sw x dx) are made for 64 blocks at a time by a
loop with unsigned indices (signed ones add wraparound code that blocks vectorisation).

Assembly of the hot loops (x86-64 znver4: inspect_asm; aarch64 cortex-a76: inspect_asm under
qemu-user in the arm64 root of packaging/test-arm64.sh with NUMBA_CPU_NAME=cortex-a76):
  x86-64, q8, 4 x 4 tile, per block: per weight row 2 vpmovsxbw (16 weights to int16 each),
    prefetcht0; per activation row 2 vmovdqu (x); per pair vpmaddwd, vpdpwssd, vcvtdq2ps,
    vfmadd231ps with the scale broadcast from memory ({1to8}); accumulators in ymm registers.
  x86-64, q4 (VNNI), 4 x 4 tile: per weight row vbroadcasti32x4 + vpsrlvd + vpandq
    (nibbles), prefetcht0; per activation row vmovdqu of x and of the start values; per pair
    a register copy of the start values (vmovdqa64), vpdpbusd, vcvtdq2ps, vfmadd231ps {1to8}.
  aarch64, q4, 3-row tile: ldr q (16 bytes), and + usra (nibbles, -8 folded), per row 2 sdot,
    2 scvtf, 2 fmla by element; q8: sshll/sshll2 once, per row smull/smlal/smlal2 x8, 2 scvtf,
    2 fmla; accumulators in registers. The 4-row tile is not unrolled there (its accumulators
    go through the stack), so TILE_ROWS is 3 and TILE_OUT 1 off x86.

Large N (prefill): `matmul_q8_prefill` / `matmul_q4_prefill` dequantize equal tiles of output
rows (<= PREFILL_TILE_FLOATS floats) to f32 into a scratch buffer (parallel Numba kernel) and
multiply with NumPy's BLAS straight into out[:, tile]. The dequantized tile is exactly the
weight the small-N kernels use, but BLAS sums in its own order, so prefill rows are not
bitwise equal to decode rows (nothing needs that: a prompt is never re-verified).

Every kernel has a naive twin (`*_reference`: NumPy dequantize, float64 product; the small-N
twins quantize the activations as the kernels do) for tests.
Cold compile (first use, cached on disk after): about 8-15 s per kernel here.
"""

import os
import platform

import numba
import numpy as np
from llvmlite import binding as llvm
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


# MERLIN_QKERNEL=generic builds the non-x86 code (LLVM partial reductions, 8 lanes, int8
# activations for q4) on x86 too, to test it here or read its IR for aarch64 (debugging only:
# use a separate NUMBA_CACHE_DIR, the on-disk cache does not key on it).
_X86 = platform.machine().lower() in ("x86_64", "amd64") and (
    os.environ.get("MERLIN_QKERNEL", "") != "generic"
)


def _target_features() -> str:
    """The CPU features Numba compiles for, as Numba picks them: NUMBA_CPU_FEATURES if set
    (also "" for NUMBA_CPU_NAME=generic), else the host's."""
    if numba.config.CPU_FEATURES is not None:
        return numba.config.CPU_FEATURES
    return llvm.get_host_cpu_features().flatten()


_FEATURES = set(_target_features().split(",")) if _X86 else set()
# vpdpbusd (u8 x s8 -> int32, 4 products per lane) on 256-bit vectors: AVX512-VNNI with VL
# (Zen 4, Ice Lake and later) or the VEX form AVX-VNNI (Alder Lake); one LLVM intrinsic for both.
_VNNI = {"+avx512vnni", "+avx512vl"} <= _FEATURES or "+avxvnni" in _FEATURES
# int32 lanes per block dot: 8 everywhere (x86: 256-bit vpmaddwd/vpdpwssd or vpdpbusd; a
# 512-bit op costs two 256-bit pipe slots on Zen 4, so 16 lanes only doubled the per-row cost
# of converting and scaling them; aarch64: sdot)
LANES = 8
# Activations are quantized per block of 32 like the weights: to int16 (scale absmax / 32767,
# an error far below the weights' own) for q8 weights everywhere (int8 cost q8 1.5 points of
# top-1 agreement, tests/test_quality.py), and for q4 on x86 without VNNI, where vpmaddwd
# takes int16 anyway; to int8 (absmax / 127, llama.cpp's choice) for q4 with vpdpbusd or sdot,
# which multiply bytes, where q4's own error dominates.
XQ8_DTYPE = np.int16
XQ4_DTYPE = np.int16 if _X86 and not _VNNI else np.int8
# A register tile is TILE_ROWS activation rows x TILE_OUT weight rows (one accumulator each):
# a weight block is unpacked once for all its activation rows, an activation block loaded
# once for all its weight rows. x86 has 32 vector registers for the 16 accumulators; aarch64
# kept 3 x 1 (its 4-row tile went through the stack).
TILE_ROWS = 4 if _X86 else 3
TILE_OUT = 4 if _X86 else 1
# Tiles over TILE_OUT weight rows read that many weight streams at once, which halved the DRAM
# bandwidth of decode (N = 1, 2) here: calls with fewer activation rows than this, which are
# bandwidth-bound anyway, tile over one weight row (same arithmetic per output: bitwise equal).
WIDE_FROM = 3
SCALE_CHUNK = 64  # blocks whose scales are made at once (stack scratch)
ACC_FLOATS = TILE_OUT * TILE_ROWS * LANES
SCALE_FLOATS = TILE_OUT * TILE_ROWS * SCALE_CHUNK
INV_LEVEL16 = np.float32(1.0 / 32767.0)
INV_LEVEL8 = np.float32(1.0 / 127.0)
_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()


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


# --------------------------------------------------------------------------- activations


@njit(nogil=True, cache=True)
def quantize_activations(x, xq, dx):
    """xq[n, k] = rint(x[n, k] / dx[n, k // 32]), dx = absmax of the block / 32767 for an
    int16 xq, / 127 for int8. No fastmath: the twin in NumPy rounds the same."""
    n_rows, k_dim = x.shape
    for n in range(n_rows):
        for b in range(k_dim // BLOCK):
            m = np.float32(0.0)
            for j in range(BLOCK):
                m = max(m, abs(x[n, b * BLOCK + j]))
            d = m * (INV_LEVEL16 if xq.itemsize == 2 else INV_LEVEL8)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            dx[n, b] = d
            for j in range(BLOCK):
                xq[n, b * BLOCK + j] = np.rint(x[n, b * BLOCK + j] * inv)


# --------------------------------------------------------------------------- block dot


def _array_ptr(context, builder, aty, arr, idx):
    return builder.gep(context.make_array(aty)(context, builder, arr).data, [idx])


def _load(builder, ptr, elem, count):
    vec = ir.VectorType(elem, count)
    return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=1)


def _half(builder, v, h):
    """Elements 16h .. 16h + 15 of a 32-element vector."""
    return builder.shuffle_vector(
        v, v, ir.Constant(ir.VectorType(_I32, 16), list(range(16 * h, 16 * h + 16)))
    )


def _int_lanes(builder, w, x):
    """<32 x i8> weights times <32 x i8|i16> activations -> <LANES x i32> partial sums, exact.
    x86: lane l sums products 2l, 2l + 1, 16 + 2l, 16 + 2l + 1 (two 256-bit vpmaddwd, the
    second fused with the add into vpdpwssd on VNNI hosts); elsewhere LLVM's partial
    reduction (sdot on aarch64)."""
    if _X86:
        v16 = ir.VectorType(_I32, 16)
        even = ir.Constant(ir.VectorType(_I32, LANES), list(range(0, 16, 2)))
        odd = ir.Constant(ir.VectorType(_I32, LANES), list(range(1, 16, 2)))
        sums = []
        for h in (0, 1):
            prod = builder.mul(
                builder.sext(_half(builder, w, h), v16), builder.sext(_half(builder, x, h), v16)
            )
            sums.append(
                builder.add(
                    builder.shuffle_vector(prod, prod, even),
                    builder.shuffle_vector(prod, prod, odd),
                )
            )
        return builder.add(sums[1], sums[0])
    v32 = ir.VectorType(_I32, 32)
    prod = builder.mul(builder.sext(w, v32), builder.sext(x, v32))
    lanes = ir.VectorType(_I32, LANES)
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(lanes, [lanes, v32]),
        f"llvm.vector.partial.reduce.add.v{LANES}i32.v32i32",
    )
    return builder.call(fn, [ir.Constant(lanes, None), prod])


def _fma_into(builder, acc, lane0, ints, scale):
    """acc[lane0 : lane0 + LANES] = fma(float(ints), scale, acc[...]) (one rounding)."""
    vec = ir.VectorType(_F32, LANES)
    ptr = builder.bitcast(builder.gep(acc, [lane0]), vec.as_pointer())
    splat = builder.insert_element(ir.Constant(vec, None), scale, _I32(0))
    splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(_I32, LANES), None))
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{LANES}f32"
    )
    builder.store(builder.call(fma, [builder.sitofp(ints, vec), splat, builder.load(ptr)]), ptr)


def _block_dot_intrinsic(load_weights):
    @intrinsic
    def block_dot(typingctx, acc, lane0, qs, qi, xq, xi, scale):
        def codegen(context, builder, signature, args):
            acc_ptr, lane0_v, qs_v, qi_v, xq_v, xi_v, scale_v = args
            w = load_weights(builder, _array_ptr(context, builder, signature.args[2], qs_v, qi_v))
            x_elem = ir.IntType(signature.args[4].dtype.bitwidth)
            x_ptr = _array_ptr(context, builder, signature.args[4], xq_v, xi_v)
            x = _load(builder, x_ptr, x_elem, 32)
            _fma_into(builder, acc_ptr, lane0_v, _int_lanes(builder, w, x), scale_v)
            return context.get_dummy_value()

        return types.void(acc, lane0, qs, qi, xq, xi, scale), codegen

    return block_dot


def _q8_weights(builder, ptr):
    return _load(builder, ptr, _I8, 32)


def _q4_nibbles(builder, ptr):
    """16 bytes -> the block's 32 stored nibbles (q + 8, 0..15) in order: low, then high.
    Both halves from one copy of the bytes shifted by 0 and 4 bits (vbroadcasti128, vpsrlvd,
    vpand: two instructions besides the load)."""
    raw = _load(builder, ptr, _I8, 16)
    both = builder.shuffle_vector(
        raw, raw, ir.Constant(ir.VectorType(_I32, 32), list(range(16)) * 2)
    )
    v8 = ir.VectorType(_I32, 8)
    shifted = builder.lshr(builder.bitcast(both, v8), ir.Constant(v8, [0] * 4 + [4] * 4))
    v32 = ir.VectorType(_I8, 32)
    return builder.and_(builder.bitcast(shifted, v32), ir.Constant(v32, [15] * 32))


def _q4_weights(builder, ptr):
    """The block's 32 weights q in order (nibbles minus 8)."""
    return builder.sub(_q4_nibbles(builder, ptr), ir.Constant(ir.VectorType(_I8, 32), [8] * 32))


q8_block_dot = _block_dot_intrinsic(_q8_weights)
q4_block_dot = _block_dot_intrinsic(_q4_weights)
"""acc[lane0:lane0+LANES] += float(int lanes of w-block . x-block) * scale, where the weight
block starts at qs.flat[qi] (q8: 32 int8; q4: 16 packed bytes) and the activation block at
xq.flat[xi]."""


@intrinsic
def q4_block_dot_vnni(typingctx, acc, lane0, qs, qi, xq, xi, xs, si, scale):
    """q4_block_dot for int8 activations with vpdpbusd (only built on VNNI hosts): the stored
    nibbles (unsigned) times x, 4 adjacent products per lane, starting from
    xs.flat[si : si + 8] = -8 x (sums of 4 activations), which takes off the +8 of the
    stored weights exactly."""

    def codegen(context, builder, signature, args):
        acc_ptr, lane0_v, qs_v, qi_v, xq_v, xi_v, xs_v, si_v, scale_v = args
        u = _q4_nibbles(builder, _array_ptr(context, builder, signature.args[2], qs_v, qi_v))
        x = _load(builder, _array_ptr(context, builder, signature.args[4], xq_v, xi_v), _I8, 32)
        start = _load(builder, _array_ptr(context, builder, signature.args[6], xs_v, si_v), _I32, 8)
        v8 = ir.VectorType(_I32, 8)
        v32 = ir.VectorType(_I8, 32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8, [v8, v32, v32]), "llvm.x86.avx512.vpdpbusd.256"
        )
        _fma_into(builder, acc_ptr, lane0_v, builder.call(fn, [start, u, x]), scale_v)
        return context.get_dummy_value()

    return types.void(acc, lane0, qs, qi, xq, xi, xs, si, scale), codegen


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _hsum_lanes(a, off):
    """Sum of a[off : off + 8] in a fixed pairwise order."""
    return ((a[off + 0] + a[off + 4]) + (a[off + 2] + a[off + 6])) + (
        (a[off + 1] + a[off + 5]) + (a[off + 3] + a[off + 7])
    )


# --------------------------------------------------------------------------- small N


@njit(nogil=True, cache=True)
def q4_offset_sums(xq, xs):
    """xs[n, g] = -8 * (xq[n, 4g] + ... + xq[n, 4g + 3]): where vpdpbusd starts each lane, so
    that the unsigned stored nibbles (q + 8) give the dot with q exactly."""
    for n in range(xq.shape[0]):
        for g in range(xs.shape[1]):
            i = 4 * g
            xs[n, g] = -8 * (
                np.int32(xq[n, i])
                + np.int32(xq[n, i + 1])
                + np.int32(xq[n, i + 2])
                + np.int32(xq[n, i + 3])
            )


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _block(block_bytes, x_q, xs, sc, n0, nr, qs, o0, no, b, c0, acc_ptr):
    """Weight block b of rows o0 .. o0 + no - 1 against activation rows n0 .. n0 + nr - 1,
    into their accumulators (nr and no are constants after inlining: the loops unroll and the
    accumulators stay in registers). sc holds the scale products of the chunk from block c0."""
    k_dim = x_q.shape[1]
    row_bytes = qs.shape[1]
    # past a row's end the prefetch goes on into the same row of the next tile (read first
    # there), not into the next row, which this tile is reading already
    ahead = b * block_bytes + PREFETCH_BYTES
    if ahead >= row_bytes:
        ahead += (no - 1) * row_bytes
    for j in range(no):
        prefetch(qs, (o0 + j) * row_bytes + ahead)
    for n in range(nr):
        xi = (n0 + n) * k_dim + b * BLOCK
        si = (n0 + n) * (k_dim // 4) + b * (BLOCK // 4)
        for j in range(no):
            qi = (o0 + j) * row_bytes + b * block_bytes
            t = j * TILE_ROWS + n
            lane0 = t * LANES
            s = sc[np.uint64(t * SCALE_CHUNK + b - c0)]
            if block_bytes == BLOCK:
                q8_block_dot(acc_ptr, lane0, qs, qi, x_q, xi, s)
            elif _VNNI:
                q4_block_dot_vnni(acc_ptr, lane0, qs, qi, x_q, xi, xs, si, s)
            else:
                q4_block_dot(acc_ptr, lane0, qs, qi, x_q, xi, s)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _tile(block_bytes, x_q, xs, dx, n0, nr, qs, scales, o0, no, out):
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
            _block(block_bytes, x_q, xs, sc, n0, nr, qs, o0, no, b, c0, acc_ptr)
    for j in range(no):
        for n in range(nr):
            out[n0 + n, o0 + j] = _hsum_lanes(acc, (j * TILE_ROWS + n) * LANES)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _tiles(block_bytes, x_q, xs, dx, qs, scales, o0, no, out):
    """All activation rows against weight rows o0 .. o0 + no - 1: tiles of TILE_ROWS, then
    the rest (each size a separate unrolled copy)."""
    n_rows = x_q.shape[0]
    n0 = 0
    while n0 + TILE_ROWS <= n_rows:
        _tile(block_bytes, x_q, xs, dx, n0, TILE_ROWS, qs, scales, o0, no, out)
        n0 += TILE_ROWS
    rest = n_rows - n0
    if rest == 3:
        _tile(block_bytes, x_q, xs, dx, n0, 3, qs, scales, o0, no, out)
    elif rest == 2:
        _tile(block_bytes, x_q, xs, dx, n0, 2, qs, scales, o0, no, out)
    elif rest == 1:
        _tile(block_bytes, x_q, xs, dx, n0, 1, qs, scales, o0, no, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _matmul_small(block_bytes, x, x_q, xs, dx, qs, scales, out):
    n_out = qs.shape[0]
    quantize_activations(x, x_q, dx)
    if xs.shape[1] > 0:
        q4_offset_sums(x_q, xs)
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    wide = TILE_OUT > 1 and x.shape[0] >= WIDE_FROM
    for task in prange(n_tasks):
        end = min(n_out, (task + 1) * ROWS_PER_TASK)
        o0 = task * ROWS_PER_TASK
        if wide:
            while o0 + TILE_OUT <= end:
                _tiles(block_bytes, x_q, xs, dx, qs, scales, o0, TILE_OUT, out)
                o0 += TILE_OUT
        while o0 < end:
            _tiles(block_bytes, x_q, xs, dx, qs, scales, o0, 1, out)
            o0 += 1


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
    xs = np.empty((n_rows, 0), np.int32)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    _matmul_small(BLOCK, x, x_q, xs, dx, qs, scales, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q4(x, qs, scales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k] with w in q4 and x quantized to q8_0 here.
    x: [N, K] f32 C-contiguous; qs: uint8 [O, K // 2]; scales: uint16 [O, K // 32] (bf16
    bits, or float32); out: [N, O] f32. K must be a multiple of 32."""
    n_rows, k_dim = x.shape
    n_out = qs.shape[0]
    if qs.shape[1] * 2 != k_dim or scales.shape[1] * BLOCK != k_dim or scales.shape[0] != n_out:
        raise ValueError("matmul_q4: shapes of x, qs and scales do not match")
    if out.shape[0] != n_rows or out.shape[1] != n_out:
        raise ValueError("matmul_q4: out must be [N, O]")
    x_q = np.empty((n_rows, k_dim), XQ4_DTYPE)
    xs = np.empty((n_rows, k_dim // 4 if _VNNI else 0), np.int32)  # vpdpbusd start values
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    _matmul_small(BLOCK // 2, x, x_q, xs, dx, qs, scales, out)


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


def quantize_activations_reference(x, dtype):
    """Naive twin of quantize_activations to `dtype` (int16 or int8): (xq, dx)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    d = np.abs(blocks).max(axis=2) * (INV_LEVEL16 if np.dtype(dtype).itemsize == 2 else INV_LEVEL8)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    xq = np.rint(blocks * inv[:, :, None]).astype(np.int32).reshape(x.shape)
    return xq, d.astype(np.float32)


def _small_n_reference(dequantize, x_dtype, x, qs, scales):
    xq, dx = quantize_activations_reference(x, x_dtype)
    xd = (xq.reshape(len(xq), -1, BLOCK) * dx[:, :, None].astype(np.float64)).reshape(xq.shape)
    return (xd @ dequantize(qs, scales).T).astype(np.float32)


def matmul_q8_reference(x, qs, scales):
    """Naive twin of matmul_q8_prefill: dequantize, float64 product."""
    return (x.astype(np.float64) @ dequantize_q8_reference(qs, scales).T).astype(np.float32)


def matmul_q4_reference(x, qs, scales):
    """Naive twin of matmul_q4_prefill: dequantize, float64 product."""
    return (x.astype(np.float64) @ dequantize_q4_reference(qs, scales).T).astype(np.float32)


def matmul_q8_small_reference(x, qs, scales):
    """Naive twin of matmul_q8: activations quantized as there, float64 product."""
    return _small_n_reference(dequantize_q8_reference, XQ8_DTYPE, x, qs, scales)


def matmul_q4_small_reference(x, qs, scales):
    """Naive twin of matmul_q4: activations quantized as there, float64 product."""
    return _small_n_reference(dequantize_q4_reference, XQ4_DTYPE, x, qs, scales)
