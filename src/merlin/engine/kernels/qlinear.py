"""Weight matrix products for q8_0 weights (one scale per 32 weights), row-major.

Format (made by engine/quant.py; C-contiguous, row-major like the f32 weight [O, K]):

    qs int8 [O, K], scales uint16 [O, K // 32] (bfloat16 bits; float32 scale arrays work too)
    weight = qs[o, k] * scale(o, k // 32)

The model runs q4 always, and q8 on x86 with AVX512-VNNI, in engine/kernels/qgroup.py (16 or 8
rows interleaved per integer dot instruction); this row-major q8 kernel is what q8 runs
elsewhere (aarch64, x86 without AVX-512). qgroup takes its shared pieces from here: the
activation quantization, the stack scratch, prefetch, the bf16 scale decode, the prefill
tiling and the CPU feature checks.

Small N (decode N = 1, speculative verify N = K + 1 <= 16): `matmul_q8`, parallel over output
rows (16 per task). The activations are quantized per block of 32 too (int16, scale
absmax / 32767) and each block is an exact integer dot product into 8 int32 lanes, scaled
once:

    acc[l] = fma(float(sum of the products in lane l of block b), sw[o, b] * dx[n, b], acc[l])
    out[n, o] = fixed pairwise tree over the 8 lanes

The int dot is plain LLVM vector IR (below): on x86, adjacent-pair sums of the two 16-weight
halves, which LLVM turns into a 256-bit vpmaddwd plus vpdpwssd (VNNI; without, a second
vpmaddwd and an add); elsewhere llvm.vector.partial.reduce.add, which aarch64 turns into
smull/smlal (int8 x int16). Per activation row and weight block that is 4 vector ops (int
dot 2, vcvtdq2ps, vfmadd). 256-bit vectors, not 512: Zen 4 runs a 512-bit op as two 256-bit
halves, so 16 lanes (a 512-bit vpmaddwd) cost as much as the two 256-bit int ops and doubled
the conversion and fma, 6 slots instead of 4.

A register tile is TILE_ROWS activation rows x TILE_OUT weight rows (4 x 4 on x86, 16
accumulators in registers): each weight block is loaded and unpacked once for its 4
activation rows, each activation block loaded once for its 4 weight rows. Tiles over one
weight row (the previous design) re-read the activations for every weight row: 64 bytes per
row and block for int16, from L1/L2, which held the verify at ~2.2 cycles per row and block
instead of the ~1.5 its vector ops need. But 4 weight rows read at once are 4 DRAM streams
per thread, and that halved the bandwidth of a decode step here (N = 1 from DRAM: 11 instead
of 22 G weights/s, 2 threads; prefetching on into the next tile did not restore it): calls
with fewer than WIDE_FROM = 3 activation rows, bandwidth-bound anyway, tile over one weight
row. The tile shape never changes the operations of one output, so the choice keeps rows
bitwise equal across N. Float weights before all that converted every weight to f32 (4
vector ops per 16 weights).

Measured with engine/qlinear_bench.py, this design against the previous one (16-lane
512-bit dots, one-weight-row tiles), runs interleaved, medians, GB/s of weight bytes:
  --threads 1 --in-cache (compute speed): N = 1 25 vs 28 (the 1-row tiles lost a little),
    N = 5 9.3 vs 7.3.
  --threads 2 (DRAM, Qwen3-VL-2B shapes): N = 5 1.2-1.7x faster over the shapes (the range
    of q8 and of the row-major q4 kernel since removed; gate_up 16.6 vs 14.0), N = 1 at
    80-90% as before. The shared dev box moves the figures by 2x
    from minute to minute: compare in one run.

Exact integer dots and no reassociation anywhere (FASTMATH without "reassoc") mean every
register tile performs the same float operations in the same order for a given (n, o): row n
of an N-row call is bitwise equal to a 1-row call on x[n], for any N and any thread count
(tests/test_quant.py checks N = 1..9 with 1 and 2 threads, for the x86 code with and without
VNNI and for the generic code). The cost of an extra activation row is its own int dot,
conversion and fma per block, so a verify of N rows is compute-bound sooner than a decode
step (V(4)/T ~2.5-2.7 in cache; from DRAM, 2 threads, 1.7-1.8).

Activation quantization error (int16: 1.5e-5 of the block's largest value) is far below the
weights' own; with int8 activations q8 agreed with f32 on 96.5% of tokens instead of 98.5%
(tests/test_quality.py), hence int16.

Stack scratch (`stack_f32`, an entry-block alloca) holds the accumulators: LLVM keeps them in
registers. A heap array there is hoisted by Numba out of the prange loop and shared by the
tasks of a thread; neighbouring threads' arrays then shared cache lines and a 2-thread call
took 8 ms instead of 1 ms. Scale products (sw x dx) are made for 64 blocks at a time by a
loop with unsigned indices (signed ones add wraparound code that blocks vectorisation).

Assembly of the hot loops (x86-64 znver4: inspect_asm; aarch64 cortex-a76: inspect_asm under
qemu-user in the arm64 root of packaging/test-arm64.sh with NUMBA_CPU_NAME=cortex-a76):
  x86-64, 4 x 4 tile, per block: per weight row 2 vpmovsxbw (16 weights to int16 each),
    prefetcht0; per activation row 2 vmovdqu (x); per pair vpmaddwd, vpdpwssd, vcvtdq2ps,
    vfmadd231ps with the scale broadcast from memory ({1to8}); accumulators in ymm registers.
  aarch64, 3-row tile: sshll/sshll2 once, per row smull/smlal/smlal2 x8, 2 scvtf, 2 fmla;
    accumulators in registers. The 4-row tile is not unrolled there (its accumulators go
    through the stack), so TILE_ROWS is 3 and TILE_OUT 1 off x86.

Large N (prefill): `matmul_q8_prefill` dequantizes equal tiles of output rows
(<= PREFILL_TILE_FLOATS floats) to f32 into a scratch buffer (parallel Numba kernel) and
multiplies with NumPy's BLAS straight into out[:, tile] (`prefill_product`). The dequantized
tile is exactly the weight the small-N kernel uses, but BLAS sums in its own order, so prefill
rows are not bitwise equal to decode rows. (The grouped kernels of qgroup.py need no such
path: their integer dots beat BLAS at every N.)

Every kernel has a naive twin (`*_reference`: NumPy dequantize, float64 product; the small-N
twin quantizes the activations as the kernel does) for tests.
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


# MERLIN_QKERNEL=generic builds the non-x86 code (LLVM partial reductions, 8 lanes; in qgroup
# the plain-IR dot) on x86 too, to test it here or read its IR for aarch64 (debugging only:
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
# vpdpbusd (u8 x s8 -> int32, 4 products per lane) on 256-bit vectors, for qgroup's q4 kernel:
# AVX512-VNNI with VL (Zen 4, Ice Lake and later) or the VEX form AVX-VNNI (Alder Lake); one
# LLVM intrinsic for both.
_VNNI = {"+avx512vnni", "+avx512vl"} <= _FEATURES or "+avxvnni" in _FEATURES
# int32 lanes per block dot: 8 everywhere (x86: 256-bit vpmaddwd/vpdpwssd; a 512-bit op costs
# two 256-bit pipe slots on Zen 4, so 16 lanes only doubled the per-row cost of converting and
# scaling them; aarch64: smull/smlal)
LANES = 8
# Activations are quantized per block of 32 like the weights, to int16 (scale absmax / 32767,
# an error far below the weights' own): int8 cost q8 1.5 points of top-1 agreement
# (tests/test_quality.py). quantize_activations also makes int8 (absmax / 127), for qgroup.
XQ8_DTYPE = np.int16
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


def _stack_scratch(n, llvm_type, numba_type):
    if not isinstance(n, types.IntegerLiteral):
        return None
    size = n.literal_value

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.ArrayType(llvm_type, size))
        slot.align = 64
        return builder.bitcast(slot, ir.PointerType(llvm_type))

    return types.CPointer(numba_type)(n), codegen


@intrinsic
def stack_f32(typingctx, n):
    """A float32 scratch of literal size n on the stack (entry-block alloca): LLVM promotes it
    to registers. A heap array here would be hoisted by Numba out of the parallel loop, shared
    by the tasks of a thread and kept in memory."""
    return _stack_scratch(n, ir.FloatType(), types.float32)


@intrinsic
def stack_i32(typingctx, n):
    """The int32 twin of stack_f32 (integer accumulators)."""
    return _stack_scratch(n, ir.IntType(32), types.int32)


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint to bring the cache line of arr.flat[idx] into L1 (llvm.prefetch: prefetcht0 on
    x86, prfm pldl1keep on aarch64). Never faults, also past the end of the array."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        emit_prefetch(builder, builder.gep(ary.data, [args[1]]))
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


def emit_prefetch(builder, ptr, locality=3):
    """The IR of prefetch() at ptr, for other intrinsics."""
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    builder.call(fn, [ptr, i32(0), i32(locality), i32(1)])  # read, locality 3: into L1, data


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


@intrinsic
def _quantize_block(typingctx, x, xi, xq, level):
    """Quantize the 32 floats at x.flat[xi:] into xq.flat[xi:] and return their scale d =
    absmax x level: rint(x / d) as rint(x * (1 / d)), 0 for an all-zero block. One vector
    of 32 (absmax as the unsigned max of the bits without sign: exact; rint and the
    conversion as vector instructions), where the scalar loop it replaced took 5 cycles a
    value (no fastmath, so LLVM kept the float max and the rounding scalar)."""
    if not (isinstance(x, types.Array) and isinstance(xq, types.Array)):
        return None
    width = xq.dtype.bitwidth

    def codegen(context, builder, signature, args):
        x_v, xi_v, xq_v, level_v = args
        vf = ir.VectorType(_F32, BLOCK)
        vi = ir.VectorType(_I32, BLOCK)
        v = _load(builder, _array_ptr(context, builder, signature.args[0], x_v, xi_v), _F32, BLOCK)
        bits = builder.and_(builder.bitcast(v, vi), ir.Constant(vi, [0x7FFFFFFF] * BLOCK))
        umax = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [vi]), f"llvm.vector.reduce.umax.v{BLOCK}i32"
        )
        d = builder.fmul(builder.bitcast(builder.call(umax, [bits]), _F32), level_v)
        positive = builder.fcmp_ordered(">", d, ir.Constant(_F32, 0.0))
        inv = builder.select(
            positive, builder.fdiv(ir.Constant(_F32, 1.0), d), ir.Constant(_F32, 0.0)
        )
        splat = builder.insert_element(ir.Constant(vf, None), inv, _I32(0))
        splat = builder.shuffle_vector(splat, splat, ir.Constant(vi, None))
        rint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf]), f"llvm.rint.v{BLOCK}f32"
        )
        q = builder.fptosi(
            builder.call(rint, [builder.fmul(v, splat)]), ir.VectorType(ir.IntType(width), BLOCK)
        )
        out = _array_ptr(context, builder, signature.args[2], xq_v, xi_v)
        builder.store(q, builder.bitcast(out, q.type.as_pointer()), align=1)
        return d

    return types.float32(x, xi, xq, level), codegen


@njit(nogil=True, cache=True)
def quantize_activations(x, xq, dx):
    """xq[n, k] = rint(x[n, k] / dx[n, k // 32]), dx = absmax of the block / 32767 for an
    int16 xq, / 127 for int8. No fastmath: the twin in NumPy rounds the same. x and xq
    C-contiguous [N, K], K a multiple of 32."""
    n_rows, k_dim = x.shape
    if not (x.flags.c_contiguous and xq.flags.c_contiguous) or xq.shape != x.shape:
        raise ValueError("quantize_activations: x and xq must be C-contiguous [N, K]")
    if k_dim % BLOCK or dx.shape[0] != n_rows or dx.shape[1] != k_dim // BLOCK:
        raise ValueError("quantize_activations: K must be a multiple of 32, dx [N, K / 32]")
    level = INV_LEVEL16 if xq.itemsize == 2 else INV_LEVEL8
    for n in range(n_rows):
        for b in range(k_dim // BLOCK):
            dx[n, b] = _quantize_block(x, n * k_dim + b * BLOCK, xq, level)


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
    """<32 x i8> weights times <32 x i16> activations -> <LANES x i32> partial sums, exact.
    x86: lane l sums products 2l, 2l + 1, 16 + 2l, 16 + 2l + 1 (two 256-bit vpmaddwd, the
    second fused with the add into vpdpwssd on VNNI hosts); elsewhere LLVM's partial
    reduction (smull/smlal on aarch64)."""
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


@intrinsic
def q8_block_dot(typingctx, acc, lane0, qs, qi, xq, xi, scale):
    """acc[lane0:lane0+LANES] += float(int lanes of w-block . x-block) * scale, where the 32
    int8 weights of the block start at qs.flat[qi] and its activations at xq.flat[xi]."""

    def codegen(context, builder, signature, args):
        acc_ptr, lane0_v, qs_v, qi_v, xq_v, xi_v, scale_v = args
        w = _load(builder, _array_ptr(context, builder, signature.args[2], qs_v, qi_v), _I8, 32)
        x_elem = ir.IntType(signature.args[4].dtype.bitwidth)
        x = _load(builder, _array_ptr(context, builder, signature.args[4], xq_v, xi_v), x_elem, 32)
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


def matmul_q8_small_reference(x, qs, scales):
    """Naive twin of matmul_q8: activations quantized as there, float64 product."""
    return _small_n_reference(dequantize_q8_reference, XQ8_DTYPE, x, qs, scales)
