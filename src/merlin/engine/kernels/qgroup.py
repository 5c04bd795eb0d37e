"""q4_0 and q8_0 weights in groups of GROUP output rows, for decode and speculative verify.

GROUP is 16 (one 512-bit vector of int32 lanes) on x86 with AVX512-VNNI, 8 elsewhere (a
256-bit vector: AVX-VNNI, AVX2; two 128-bit NEON vectors). Layouts (made by pack_q4_groups /
pack_q8_groups from the row-major formats of engine/quant.py; a matrix whose row count is not
a multiple of GROUP gets zero rows appended to its last group):

    q4 packed  uint8 [O / G, K / 32, 16 G]  block b of the G rows of a group: 4 slices of 4 G
                                            bytes; byte 4r + i of slice j holds weight 4j + i
                                            of row r in its low nibble and weight 16 + 4j + i
                                            in its high nibble, each stored as q + 8
    q8 packed  int8  [O / G, K / 32, 32 G]  16 slices of 2 G bytes; bytes 2r, 2r + 1 of slice
                                            j hold weights 2j, 2j + 1 of row r
    q8a8       int8  [O / G, K / 32, 32 G]  q8 weights for int8 activations: 8 slices of 4 G
                                            bytes; bytes 4r .. 4r + 3 of slice j hold weights
                                            4j .. 4j + 3 of row r, plus Q8A8_BIAS (mod 256)
    gscales    uint16 [O / G, K / 32, G]    the G rows' bf16 scales of block b

Why: a row-major kernel (engine/kernels/qlinear.py) gives every (activation row, weight row)
its own lane accumulators and pays, per block, an int dot, a conversion and an fma for each
pair. Here one slice holds 4 (q4) or 2 (q8) weights of every row of the group, so one integer
dot-product instruction with those activations broadcast to every lane adds up all G rows:
q4 vpdpbusd (x86) / sdot (aarch64), 4 byte products per 32-bit lane; q8 vpdpwssd, 2 int16
products per lane, on the weights sign-extended once per block for all activation rows.
After a block each lane holds its row's block dot, and the conversion, the scale (a vector
of G row scales) and the fma are shared by the G rows. The q4 weights stay unsigned nibbles;
the -8 is taken out exactly by starting each block's accumulator at -8 x (sum of the block's
activations).

Measured (engine/qlinear_bench.py, 2B shapes, from DRAM, 2 threads, the Ice Lake dev box of
2026-12-01 whose read bandwidth was 19-26 GB/s that day; V(N)/T = time of N rows over 1 row,
medians of 5 interleaved repeats, noisy to +-0.2):
  q8 16-row groups vs row-major, N = 5: gate_up 1.57 vs 1.97, down 1.47 vs 2.10, lm_head
    1.47 vs 1.96; N = 2: 1.0-1.1 vs 1.1-1.2; N = 1 at 82-98% of the bandwidth either way.
    (On the Zen 4 box of 2026-11-30 an earlier 16-row q8 ran 0.75-0.9x the row-major one at
    N = 2-3; that build had 4-row tiles and no 512-bit vpmovsxbw; not re-measured there.)
  q4 16-row groups and 8-row tiles vs 8-row groups and 4-row tiles, N = 5: gate_up 1.57 vs
    2.02, down 1.74 vs 1.91, lm_head 1.17 vs 2.01; N = 9: 2.2-2.5 vs 3.0-3.8.
  The verify is compute-bound: V(9)/T ~2.2 means each extra row costs ~0.15-0.3 T. In cache
  (one thread) a row of 512 weights (one q4 block of 16 rows) takes 4.8-6.5 ns at N = 8 and
  12-13 ns at N = 1, where 8 vpdpbusd zmm alone retire in 2 ns (measured peak 3.9 G/s on one
  core): latency and the per-row conversion and scaling, not the multiply, are the limit.

A tile's block is one intrinsic (group_tile_block) for all its activation rows, the loop over
weight slices outside the loop over rows. Against one call per row (the code before
2026-12-01's fourth run: LLVM kept all 16 sign-extended q8 slices live, spilled two of the
5-row tile's accumulators and reloaded each row's indexes from the stack), in cache on one
thread, the same process alternating the two, medians of 15: q4 N = 1 0.63-0.79x the time,
N = 2 0.68-0.83x, N = 5 0.91-0.93x, N = 8 0.86-0.93x; q8 N = 1-2 0.77-0.91x, N = 5 0.90-1.00x,
N = 8 0.96-1.05x. Outputs bit for bit the same.

Assembly (inspect_asm, x86-64 icelake-server): per block 4 vmovdqu64 + 4 vpandq + 4
vgf2p8affineqb unpack the q4 nibbles once for all rows (q8: 16 vpmovsxbw); per activation row
8 vpdpbusd (q8: 16 vpdpwssd) zmm with the activations broadcast from memory ({1to16}) in two
chains, then vpaddd, vcvtdq2ps, vmulps {1to16}, vfmadd. The 5-row tile (a verify of 4 drafts)
is 112 instructions a block for q4 (40 vpdpbusd) and 159 for q8 (80 vpdpwssd), accumulators
in registers. What bounds it: on Ice Lake every 512-bit vector uop goes to ports 0 and 5, and
vpdpwssd zmm retires at 4.2-4.8 G/s a core here (a C loop of independent dots): 80 of them are
17-19 ns against the tile's 37-54 ns a block in cache; a C version of the same loop (gcc -O3)
took 37-40 ns. The 8-row q8 tile has LLVM split many dots into vpmaddwd + vpaddd and spill.
Zen 4 (znver4, at b5b9241): the q4 5-row tile is 106 instructions a block, 40 vpdpbusd, the
high nibbles by vpsrlw + vpandq (_high_nibbles), 4 prefetcht1 8 KB ahead; the constant masks
are reloaded from memory each block (32 zmm registers do not hold them and the tile). There one
512-bit vpdpbusd issues a cycle and vmulps / vfmadd / vgf2p8affineqb take the same slot (a C
loop: 8 dots alone 8 cycles, with 4 of any of those 12, with 4 vpaddd, vpsrlw, vpandq or
vcvtdq2ps still 8): the tile's 50 such instructions are 13.7 ns at 3.66 GHz, against 16.2 ns
measured in cache.
aarch64 cortex-a76 (8-row groups, qemu, the arm64 root of packaging/test-arm64.sh, the
tile-level kernel at e5877a7): per block and row 16 sdot (two 4-lane halves) with ld1r
broadcasts, the nibbles unpacked once a block (and/ushr), 2 scvtf, 2 fmul, 2 fmla; the 4-row
tile is 213 instructions a block with 8 vector stores of its accumulator tile and 6 index
reloads (with two chains a row: 254 and 35 stack accesses; not timed, no board here). q8
runs row-major there (Q8_GROUPED is only set with 16-row groups: the grouped q8 has not been
checked on aarch64).

Activations are quantized per block of 32 (qlinear.quantize_activations): q4 to int8
(absmax / 127, as llama.cpp does), q8 to int16 (absmax / 32767: int8 cost q8 its quality
target, 96.5% top-1 agreement instead of 97%).

q8a8 is the q8 head of q4 models (engine.text.HEAD_INT8_ACTIVATIONS): q8 weights against
int8 activations through the q4 path's 4-byte dot, half the dot instructions of the int16
form. The 5-row tile took 24-32 instead of 36-47 ns a block in cache (one thread, two
runs); at the 2B head shape from DRAM, 2 threads, the same process alternating, 0.87-0.91x
q8's time at N = 5 and the same at N = 1. On the demo model's q4 text it agreed with f32 on
70.5% of tokens (69.0-71% with the int16 head); under q8 blocks it gave 97.5% instead of
98.5%, too close to the 97% target, so q8 models keep int16.

Prefill runs the same kernels: the groups in parallel, each group's rows against tiles of 8
activation rows, in passes of ROW_CHUNK rows. A group's weights come from DRAM for its first
tile and from L1/L2 for the others, so a prefill is bound by the dot instructions, which do
4 (int8) or 2 (int16) products a lane where an f32 fma does one. Zen 4, 2B shapes, 2 threads,
in one process (scratch script): q4 N = 512 at 590-620 G int ops/s, N = 64 at 600-620;
q8 (int16) at 300-330; NumPy sgemm on the same machine 179 GFLOP/s, and dequantizing to f32
for it (the path before) reached 120-170 at N = 512 and 15-75 at N = 17-64, where the
dequantization of every weight is a fixed cost per forward (a 29-token prompt of the 2B
model took 2.6-3.8 s). Prefill rows are then bitwise equal to decode rows too.

Every product is an exact integer, and per (n, o) the float operations are the same
sequence fma(float(dot_b) * dx[n, b], w_scale[o, b], acc) for b = 0, 1, ... whatever N, the
tile or the thread count: row n of an N-row call is bitwise equal to a 1-row call.

Dot instructions: x86 with VNNI (AVX512-VNNI or AVX-VNNI, as qlinear decides): vpdpbusd /
vpdpwssd; aarch64 with the dot-product extension: sdot for q4 and q8a8 (checked under qemu,
cortex-a76: 512 sdot in matmul_q8a8g, rows bitwise equal to 1-row calls); anywhere else (and with
MERLIN_QKERNEL=generic, to test it here) the same sums written as plain LLVM vector IR.
MERLIN_QGROUP=8|16 forces the group size (tests).
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

from .qlinear import (
    _VNNI,
    _X86,
    BLOCK,
    QFASTMATH,
    _scales_ref,
    _small_n_reference,
    _target_features,
    dequantize_q8_reference,
    emit_prefetch,
    quantize_activations,
    scale_to_f32,
    stack_f32,
)


def _dot_kind() -> str:
    """Which dot instruction the kernels are built for, on the CPU Numba compiles for."""
    if os.environ.get("MERLIN_QKERNEL", "") == "generic":
        return "generic"
    if _X86:
        return "vnni" if _VNNI else "generic"
    arm = platform.machine().lower() in ("aarch64", "arm64")
    return "sdot" if arm and "+dotprod" in _target_features().split(",") else "generic"


def _group_rows(dot: str) -> int:
    """Output rows per group: 16 (one 512-bit vpdpbusd) with AVX512-VNNI, else 8.
    MERLIN_QGROUP=8|16 overrides it (tests build both layouts here)."""
    forced = os.environ.get("MERLIN_QGROUP", "")
    if forced in ("8", "16"):
        return int(forced)
    features = set(_target_features().split(","))
    return 16 if dot == "vnni" and {"+avx512vnni", "+avx512f"} <= features else 8


def _target_cpu() -> str:
    """The CPU name Numba compiles for (NUMBA_CPU_NAME, else the host's)."""
    return numba.config.CPU_NAME or llvm.get_host_cpu_name()


DOT = _dot_kind()
_SHIFT_IN_WORDS = DOT == "vnni" and _target_cpu().startswith("znver")  # see _high_nibbles
GROUP = _group_rows(DOT)  # output rows per group: one int32 lane each
SLICE = 4 * GROUP  # bytes per slice: 4 weights of each row of the group
Q4_BLOCK_BYTES = 4 * SLICE  # one q4 block (32 weights) of the group's rows
Q8_BLOCK_BYTES = BLOCK * GROUP  # one q8 block of the group's rows
# q8 weights against int8 activations (q8a8) go through the q4 path's 4-byte dot, whose first
# operand is unsigned on x86 (vpdpbusd) and in the generic IR: stored there as w + 128 (the
# sign bit flipped) and taken out like the q4 nibbles' +8. sdot (aarch64) is signed x signed.
Q8A8_BIAS = 0 if DOT == "sdot" else 128
_Q8A8_FLIP = -Q8A8_BIAS  # w + 128 mod 256 is w with its sign bit flipped: w ^ -128
# q8 runs grouped where 16-row vpdpwssd exists (AVX512-VNNI); elsewhere row-major
# (qlinear.matmul_q8: its aarch64 code was checked, the grouped one's was not)
Q8_GROUPED = GROUP == 16
# part of the weight cache's key
LAYOUT = f"g{GROUP}" + ("q8g" if Q8_GROUPED else "") + f"b{Q8A8_BIAS}"
# activation rows per register tile: 8 x 16 lanes of accumulators in 8 of AVX-512's 32
# registers (a verify of K = 4..7 drafts in one pass over the weights; 4-row tiles and a rest
# tile read each group twice); 4 x 8 lanes elsewhere (NEON's 32 registers also hold 8 rows of
# unpacked nibbles)
TILE_ROWS = 8 if GROUP == 16 else 4
ACC_FLOATS = TILE_ROWS * GROUP
# Activation rows per pass over the weights in a prefill (see _grouped): 32 rows of the 2B
# down matrix's 6144 inputs are 240 KB of int8 activations and scales, under an L2 of 512 KB
# (Cortex-A76) or 1 MB (Zen 4). Zen 4, 2 threads, N = 512: q4 gate_up 45.4 / 43.8 / 42.6 ms
# with 32 / 64 / 128 rows a pass against 48.6 with one pass; down 21.0 ms with any.
ROW_CHUNK = 32
# Software prefetch in a thread's weights (its groups are one sequential stream). Tiles of 1-2
# rows, fast enough to be bound by memory latency, prefetch into L1 STREAM_PREFETCH bytes
# ahead: 4096 against 1024 (Ice Lake, from DRAM, 2 threads, the same process alternating the
# two): q8 0.82-0.97x the time at N = 1 and 5, q4 0.83-0.98x; 8192 no better. Tiles of 3 or
# more rows, bound by their dot instructions, prefetch into L2 only (prefetcht1), L2_PREFETCH
# ahead: the L1 prefetches' misses held the core's few L1 miss buffers while it computed
# (Zen 4, from DRAM, 2 threads, 2B shapes, alternating, 35-50 GB/s moments), at N = 5: q4
# gate_up 0.86-0.90x the time, down 0.79x, q8 0.74-0.75x, the q8a8 head 0.82x; N = 3-4 alike;
# at N = 1 prefetching into L2 was 1.03-1.5x slower, so it stays L1 there. 16384 ahead no
# better than 8192.
STREAM_PREFETCH = 4096
L2_PREFETCH = 8192
L1_PREFETCH_ROWS = 2


def _prefetch_for(rows: int) -> tuple[int, int]:
    """(bytes ahead, llvm.prefetch locality: 3 into L1, 2 into L2) for a tile of `rows`
    activation rows."""
    return (STREAM_PREFETCH, 3) if rows <= L1_PREFETCH_ROWS else (L2_PREFETCH, 2)


def _chains(rows: int) -> int:
    """Dependency chains of dot instructions per activation row and block: one chain waits on
    each instruction's latency (x86: 2 were 15% faster in cache than 1 for q4 at N = 1, 4 no
    faster; 1 chain with the rows as the parallelism 11-17% slower for q8 at N = 5). With
    8-row groups a vector is two NEON registers, and a 4-row tile of 2 chains spilled to the
    stack in the cortex-a76 assembly (35 stack accesses a block), so tiles of 3 or more rows
    take 1 chain there: still 6-8 independent chains a block."""
    return 2 if GROUP == 16 or rows <= 2 else 1


_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_VI32 = ir.VectorType(_I32, GROUP)
_VI8 = ir.VectorType(_I8, SLICE)
_VI16 = ir.VectorType(ir.IntType(16), SLICE // 2)
_VF = ir.VectorType(_F32, GROUP)


def _splat(builder, value, vec):
    first = builder.insert_element(ir.Constant(vec, None), value, _I32(0))
    return builder.shuffle_vector(first, first, ir.Constant(ir.VectorType(_I32, vec.count), None))


def _vnni(builder, name, acc, a, b):
    """acc + the x86 VNNI dot `name` (vpdpbusd: 4 u8 x s8 products per lane; vpdpwssd: 2
    int16 x int16) on GROUP lanes."""
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(_VI32, [_VI32, a.type, b.type]),
        f"llvm.x86.avx512.{name}.{32 * GROUP}",
    )
    return builder.call(fn, [acc, a, b])


def _add_lane_sums(builder, acc, prod, per):
    """acc[r] + prod[per r] + ... + prod[per r + per - 1]: plain IR for the dot instructions."""
    for i in range(per):
        pick = ir.Constant(_VI32, list(range(i, per * GROUP, per)))
        acc = builder.add(acc, builder.shuffle_vector(prod, prod, pick))
    return acc


def _dot4(builder, acc, w, xword):
    """acc[r] + sum_i w[4r + i] * x[i] for the GROUP lanes r: w the slice's unsigned nibbles,
    xword the 4 activations (int8) packed in an i32."""
    xs = builder.bitcast(_splat(builder, xword, _VI32), _VI8)
    if DOT == "vnni":
        return _vnni(builder, "vpdpbusd", acc, w, xs)
    if DOT == "sdot":
        v4, v16 = ir.VectorType(_I32, 4), ir.VectorType(_I8, 16)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(v4, [v4, v16, v16]),
            "llvm.aarch64.neon.sdot.v4i32.v16i8",
        )
        quarters = []  # 128-bit sdot on 4 lanes at a time
        for h in range(GROUP // 4):
            lanes = ir.Constant(ir.VectorType(_I32, 4), list(range(4 * h, 4 * h + 4)))
            bytes_ = ir.Constant(ir.VectorType(_I32, 16), list(range(16 * h, 16 * h + 16)))
            parts = [builder.shuffle_vector(acc, acc, lanes)]
            parts += [builder.shuffle_vector(v, v, bytes_) for v in (w, xs)]
            quarters.append(builder.call(fn, parts))
        while len(quarters) > 1:
            width = 2 * quarters[0].type.count
            join = ir.Constant(ir.VectorType(_I32, width), list(range(width)))
            quarters = [
                builder.shuffle_vector(quarters[i], quarters[i + 1], join)
                for i in range(0, len(quarters), 2)
            ]
        return quarters[0]
    wide = ir.VectorType(_I32, SLICE)
    return _add_lane_sums(
        builder, acc, builder.mul(builder.zext(w, wide), builder.sext(xs, wide)), 4
    )


def _dot2(builder, acc, w, xword):
    """acc[r] + w[2r] * x[0] + w[2r + 1] * x[1] for the GROUP lanes r: w the slice's int8
    weights, xword 2 int16 activations packed in an i32. x86 with VNNI: vpmovsxbw +
    vpdpwssd; elsewhere plain IR (vpmaddwd + vpaddd, smull/smlal-like code)."""
    v16 = ir.VectorType(ir.IntType(16), 2 * GROUP)
    w16 = builder.sext(w, v16)
    xs = builder.bitcast(_splat(builder, xword, _VI32), v16)
    if DOT == "vnni":
        return _vnni(builder, "vpdpwssd", acc, w16, xs)
    pairs = ir.VectorType(_I32, 2 * GROUP)
    return _add_lane_sums(
        builder, acc, builder.mul(builder.sext(w16, pairs), builder.sext(xs, pairs)), 2
    )


def _high_nibbles(builder, w, low):
    """w >> 4 bytewise. With GFNI LLVM makes that one vgf2p8affineqb, which Zen 4 runs on the
    two pipes of vpdpbusd, vmulps and vfmadd (a 5-row tile is bound by them: 40 dots, 5 mul,
    5 fma a block); there it is a 16-bit shift and a mask instead, on the other two pipes
    (in cache, one thread: 0.92x the time at N = 5 and 8, same at N = 1)."""
    if not _SHIFT_IN_WORDS:
        return builder.lshr(w, ir.Constant(_VI8, [4] * SLICE))
    words = builder.bitcast(w, _VI16)
    shifted = builder.lshr(words, ir.Constant(_VI16, [4] * (SLICE // 2)))
    return builder.and_(builder.bitcast(shifted, _VI8), low)


def _q4_tile_ints(builder, w_base, x_words, corrs):
    """The int32 block dots of the group's rows with each activation row r (x_words[r]), q4:
    per slice the nibbles are unpacked once and go to every row; each row's chains
    (low and high nibbles) are added at the end, the first starting from corr (the
    nibbles' +8 taken out exactly)."""
    per_row = _chains(len(x_words))
    chains = [
        [_splat(builder, corr, _VI32)] + [ir.Constant(_VI32, [0] * GROUP)] * (per_row - 1)
        for corr in corrs
    ]
    low = ir.Constant(_VI8, [15] * SLICE)
    for j in range(4):
        ptr = builder.gep(w_base, [_I32(SLICE * j)])
        w = builder.load(builder.bitcast(ptr, _VI8.as_pointer()), align=1)
        halves = (builder.and_(w, low), _high_nibbles(builder, w, low))
        for words, row in zip(x_words, chains):
            for c, (nibbles, word) in enumerate(zip(halves, (j, 4 + j))):
                xword = builder.load(builder.gep(words, [_I32(word)]), align=1)
                row[c % per_row] = _dot4(builder, row[c % per_row], nibbles, xword)
    return [_sum(builder, row) for row in chains]


def _q8_tile_ints(builder, w_base, x_words):
    """The q8 twin of _q4_tile_ints: 16 slices of 2 weights a row, each sign-extended once
    for all activation rows."""
    per_row = _chains(len(x_words))
    chains = [[ir.Constant(_VI32, [0] * GROUP)] * per_row for _ in x_words]
    vec = ir.VectorType(_I8, 2 * GROUP)
    for j in range(BLOCK // 2):
        ptr = builder.gep(w_base, [_I32(2 * GROUP * j)])
        w = builder.load(builder.bitcast(ptr, vec.as_pointer()), align=1)
        for words, row in zip(x_words, chains):
            xword = builder.load(builder.gep(words, [_I32(j)]), align=1)
            row[j % per_row] = _dot2(builder, row[j % per_row], w, xword)
    return [_sum(builder, row) for row in chains]


def _q8a8_tile_ints(builder, w_base, x_words, corrs):
    """The q8a8 twin of _q4_tile_ints: 8 slices of 4 (biased) weights a row, no unpacking;
    chains start from corr (the bias taken out)."""
    per_row = _chains(len(x_words))
    chains = [
        [_splat(builder, corr, _VI32)] + [ir.Constant(_VI32, [0] * GROUP)] * (per_row - 1)
        for corr in corrs
    ]
    for j in range(BLOCK // 4):
        ptr = builder.gep(w_base, [_I32(SLICE * j)])
        w = builder.load(builder.bitcast(ptr, _VI8.as_pointer()), align=1)
        for words, row in zip(x_words, chains):
            xword = builder.load(builder.gep(words, [_I32(j)]), align=1)
            row[j % per_row] = _dot4(builder, row[j % per_row], w, xword)
    return [_sum(builder, row) for row in chains]


def _sum(builder, vectors):
    """The lanewise sum of a row's chains."""
    total = vectors[0]
    for v in vectors[1:]:
        total = builder.add(total, v)
    return total


@intrinsic
def group_tile_block(
    typingctx, acc, packed, pi, xq, xi, x_stride, corr, dx, di, d_stride, gscales, si, rows
):
    """For r < rows (a literal): acc[GROUP r : GROUP (r + 1)] = fma(float(dot_r) * dx_r,
    scales, acc[...]), dot_r the block dot of the rows of one group (packed.flat[pi:]) with
    activation row r's 32 values at xq.flat[xi + r x_stride:]; dx_r = dx.flat[di + r x
    d_stride] (corr likewise); scales: the GROUP bf16 at gscales.flat[si:]. The dtypes say
    the format: uint8 packed, int8 xq: q4 (dots from corr = -8 x the activations' sum); int8
    packed, int16 xq: q8 (corr unused); int8 packed, int8 xq: q8a8 (corr = -Q8A8_BIAS x the
    sum).
    Also prefetches the weights ahead (_prefetch_for). One intrinsic for all rows of a
    tile, with the loop over weight slices outside the loop over rows: each unpacked slice is
    used by every row at once (a call per row kept all 16 sign-extended q8 slices live and
    spilled the accumulators), and the row offsets are one stride, not a reloaded index per
    row."""
    if not (isinstance(gscales, types.Array) and gscales.dtype == types.uint16):
        return None  # the scales are read as bf16 bits
    if not (isinstance(xq, types.Array) and xq.dtype in (types.int8, types.int16)):
        return None
    if not isinstance(rows, types.IntegerLiteral):
        return None
    if not (isinstance(packed, types.Array) and packed.dtype in (types.int8, types.uint8)):
        return None
    kind = "q4" if packed.dtype == types.uint8 else "q8" if xq.dtype == types.int16 else "q8a8"
    if kind == "q4" and xq.dtype != types.int8:
        return None
    n_rows = rows.literal_value
    block_bytes = Q4_BLOCK_BYTES if kind == "q4" else Q8_BLOCK_BYTES

    def codegen(context, builder, signature, args):
        acc_p, packed_v, pi_v, xq_v, xi_v, xs_v, corr_v, dx_v, di_v, ds_v, gs_v, si_v, _ = args
        sig = signature.args

        def data(i, value):
            return context.make_array(sig[i])(context, builder, value).data

        w_base = builder.gep(data(1, packed_v), [pi_v])
        ahead, locality = _prefetch_for(n_rows)
        for line in range(0, block_bytes, 64):
            emit_prefetch(builder, builder.gep(w_base, [_I32(ahead + line)]), locality)
        x_base = builder.gep(data(3, xq_v), [xi_v])
        offsets = [builder.mul(xs_v, ir.Constant(xs_v.type, r)) for r in range(n_rows)]
        x_words = [
            builder.bitcast(builder.gep(x_base, [off]), _I32.as_pointer()) for off in offsets
        ]
        d_offsets = [
            builder.add(di_v, builder.mul(ds_v, ir.Constant(ds_v.type, r))) for r in range(n_rows)
        ]
        if kind == "q8":
            dots = _q8_tile_ints(builder, w_base, x_words)
        else:
            corr_data = data(6, corr_v)
            corrs = [builder.load(builder.gep(corr_data, [off])) for off in d_offsets]
            tile_ints = _q4_tile_ints if kind == "q4" else _q8a8_tile_ints
            dots = tile_ints(builder, w_base, x_words, corrs)
        s_ptr = builder.gep(data(10, gs_v), [si_v])
        vi16 = ir.VectorType(ir.IntType(16), GROUP)
        bits = builder.load(builder.bitcast(s_ptr, vi16.as_pointer()), align=2)
        wide = builder.shl(builder.zext(bits, _VI32), ir.Constant(_VI32, [16] * GROUP))
        scales = builder.bitcast(wide, _VF)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fma.v{GROUP}f32"
        )
        dx_data = data(7, dx_v)
        for r, (dot, off) in enumerate(zip(dots, d_offsets)):
            dx_r = builder.load(builder.gep(dx_data, [off]))
            scaled = builder.fmul(builder.sitofp(dot, _VF), _splat(builder, dx_r, _VF))
            a_ptr = builder.bitcast(builder.gep(acc_p, [_I32(GROUP * r)]), _VF.as_pointer())
            builder.store(builder.call(fma, [scaled, scales, builder.load(a_ptr)]), a_ptr)
        return context.get_dummy_value()

    sig = types.void(acc, packed, pi, xq, xi, x_stride, corr, dx, di, d_stride, gscales, si, rows)
    return sig, codegen


@njit(nogil=True, cache=True)
def _offset_sums(xq, bias, corr):
    """corr[n, b] = -bias x sum of activation block b of row n (the weights' stored +bias,
    taken out; negated here so that a chain starts from a broadcast load, not a negation in
    a general register and a move into the vector unit)."""
    for n in range(xq.shape[0]):
        for b in range(xq.shape[1] // BLOCK):
            s = np.int32(0)
            for j in range(BLOCK):
                s += np.int32(xq[n, b * BLOCK + j])
            corr[n, b] = -bias * s


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _tile(packed, gscales, xq, dx, corr, g, n0, nr, out):
    """out[n0 : n0 + nr, GROUP g : GROUP (g + 1)] (rows past out's width are padding,
    dropped)."""
    n_blocks, block_bytes = packed.shape[1], packed.shape[2]
    k_dim = xq.shape[1]
    acc_ptr = stack_f32(ACC_FLOATS)
    acc = carray(acc_ptr, ACC_FLOATS)
    for i in range(nr * GROUP):
        acc[i] = 0.0
    for b in range(n_blocks):
        group_tile_block(
            acc_ptr,
            packed,
            (g * n_blocks + b) * block_bytes,
            xq,
            n0 * k_dim + b * BLOCK,
            k_dim,
            corr,
            dx,
            n0 * n_blocks + b,
            n_blocks,
            gscales,
            (g * n_blocks + b) * GROUP,
            nr,
        )
    rows = min(GROUP, out.shape[1] - g * GROUP)
    for n in range(nr):
        for r in range(rows):
            out[n0 + n, g * GROUP + r] = acc[n * GROUP + r]


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _grouped(packed, gscales, xq, dx, corr, out):
    """All groups (parallel) against all activation rows, in register tiles of TILE_ROWS
    rows, then the rest (each size a separate unrolled copy). Many rows (a prefill) go in
    passes of ROW_CHUNK, each over all the weights: a pass's activations stay in L2 while a
    group's weights, read from DRAM by its first tile, serve its other tiles from L1/L2."""
    n_rows = xq.shape[0]
    for r0 in range(0, n_rows, ROW_CHUNK):
        r1 = min(n_rows, r0 + ROW_CHUNK)
        for g in prange(packed.shape[0]):
            n0 = r0
            while n0 + TILE_ROWS <= r1:
                _tile(packed, gscales, xq, dx, corr, g, n0, TILE_ROWS, out)
                n0 += TILE_ROWS
            rest = r1 - n0
            if rest == 7:
                _tile(packed, gscales, xq, dx, corr, g, n0, 7, out)
            elif rest == 6:
                _tile(packed, gscales, xq, dx, corr, g, n0, 6, out)
            elif rest == 5:
                _tile(packed, gscales, xq, dx, corr, g, n0, 5, out)
            elif rest == 4:
                _tile(packed, gscales, xq, dx, corr, g, n0, 4, out)
            elif rest == 3:
                _tile(packed, gscales, xq, dx, corr, g, n0, 3, out)
            elif rest == 2:
                _tile(packed, gscales, xq, dx, corr, g, n0, 2, out)
            elif rest == 1:
                _tile(packed, gscales, xq, dx, corr, g, n0, 1, out)


@njit(nogil=True, cache=True, inline="always")
def _check_shapes(x, packed, gscales, out, block_bytes):
    n_rows, k_dim = x.shape
    n_groups, n_blocks = packed.shape[0], packed.shape[1]
    if n_blocks * BLOCK != k_dim or packed.shape[2] != block_bytes:
        raise ValueError("grouped matmul: x and the packed weights differ in K")
    if gscales.shape[0] != n_groups or gscales.shape[1] != n_blocks or gscales.shape[2] != GROUP:
        raise ValueError("grouped matmul: scales do not match the packed weights")
    if out.shape[0] != n_rows or not n_groups * GROUP - GROUP < out.shape[1] <= n_groups * GROUP:
        raise ValueError("grouped matmul: out must be [N, O]")


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q4g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q4 (pack_q4_groups), x quantized per
    block to int8 here. x: [N, K] f32 C-contiguous; out: [N, O] f32, O <= GROUP x groups."""
    _check_shapes(x, packed, gscales, out, Q4_BLOCK_BYTES)
    n_rows, k_dim = x.shape
    xq = np.empty((n_rows, k_dim), np.int8)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    corr = np.empty((n_rows, k_dim // BLOCK), np.int32)
    quantize_activations(x, xq, dx)
    _offset_sums(xq, 8, corr)
    _grouped(packed, gscales, xq, dx, corr, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q8g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q8 (pack_q8_groups), x quantized per
    block to int16 here. x: [N, K] f32 C-contiguous; out: [N, O] f32, O <= GROUP x groups."""
    _check_shapes(x, packed, gscales, out, Q8_BLOCK_BYTES)
    n_rows, k_dim = x.shape
    xq = np.empty((n_rows, k_dim), np.int16)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    corr = np.empty((n_rows, k_dim // BLOCK), np.int32)  # unread by q8 (no zeroing per call)
    quantize_activations(x, xq, dx)
    _grouped(packed, gscales, xq, dx, corr, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q8a8g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q8a8 (pack_q8a8_groups), x quantized
    per block to int8 here (as for q4: half the dot instructions of q8's int16). x: [N, K]
    f32 C-contiguous; out: [N, O] f32, O <= GROUP x groups."""
    _check_shapes(x, packed, gscales, out, Q8_BLOCK_BYTES)
    n_rows, k_dim = x.shape
    xq = np.empty((n_rows, k_dim), np.int8)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    corr = np.empty((n_rows, k_dim // BLOCK), np.int32)
    quantize_activations(x, xq, dx)
    _offset_sums(xq, Q8A8_BIAS, corr)
    _grouped(packed, gscales, xq, dx, corr, out)


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


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _dequantize_q8_slices(packed, gscales, o0, out, per, flip):
    """out[i, :] = f32 weight row o0 + i of a grouped q8 layout whose slices hold `per`
    weights of each row (q8: 2, q8a8: 4), each stored as w ^ flip. Inlined with per and flip
    constants: with per a runtime value the loop took 1.1-1.3 instead of 0.2-0.3 ns a weight."""
    n, k_dim = out.shape
    n_blocks = packed.shape[1]
    if o0 < 0 or o0 + n > packed.shape[0] * GROUP or n_blocks * BLOCK != k_dim:
        raise ValueError("dequantizing grouped q8 rows: rows or K out of range")
    for i in prange(n):
        g, r = divmod(o0 + i, GROUP)
        for b in range(n_blocks):
            s = scale_to_f32(gscales[g, b, r])
            for j in range(BLOCK // per):
                for c in range(per):
                    w = np.int32(packed[g, b, per * GROUP * j + per * r + c]) ^ flip
                    out[i, b * BLOCK + per * j + c] = np.float32(w) * s


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def dequantize_q8g_rows(packed, gscales, o0, out):
    """out[i, :] = f32 weight row o0 + i of a grouped q8 matrix; the same values as
    qlinear.dequantize_q8_rows on the row-major layout."""
    _dequantize_q8_slices(packed, gscales, o0, out, 2, 0)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def dequantize_q8a8g_rows(packed, gscales, o0, out):
    """dequantize_q8g_rows for a grouped q8a8 matrix."""
    _dequantize_q8_slices(packed, gscales, o0, out, 4, _Q8A8_FLIP)


def _group_scales(scales: np.ndarray, groups: int) -> np.ndarray:
    """[O, K/32] block scales -> [groups, K/32, GROUP], padded rows with zero scales."""
    o, n_blocks = scales.shape
    pad = groups * GROUP - o
    scales = np.concatenate([scales, np.zeros((pad, n_blocks), scales.dtype)]) if pad else scales
    return np.ascontiguousarray(scales.reshape(groups, GROUP, n_blocks).transpose(0, 2, 1))


def pack_q8_groups(qs: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-major q8 (engine/quant.py: qs int8 [O, K], scales [O, K/32]) -> (packed int8
    [O/GROUP, K/32, 32 GROUP], gscales): slice j of a block (2 GROUP bytes) holds weights
    2j, 2j + 1 of each row of the group at bytes 2r, 2r + 1. Rows padded with zeros."""
    o, k = qs.shape
    n_blocks, groups = k // BLOCK, -(-o // GROUP)
    pad = groups * GROUP - o
    qs = np.concatenate([qs, np.zeros((pad, k), np.int8)]) if pad else qs
    pairs = qs.reshape(groups, GROUP, n_blocks, BLOCK // 2, 2)
    packed = np.ascontiguousarray(pairs.transpose(0, 2, 3, 1, 4))  # [G, nb, 16, rows, 2]
    return packed.reshape(groups, n_blocks, Q8_BLOCK_BYTES), _group_scales(scales, groups)


def pack_q8a8_groups(qs: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-major q8 -> (packed int8 [O/GROUP, K/32, 32 GROUP], gscales) for int8 activations:
    slice j of a block (4 GROUP bytes) holds weights 4j .. 4j + 3 of each row of the group at
    bytes 4r .. 4r + 3, plus Q8A8_BIAS (mod 256). Rows padded with zero weights."""
    o, k = qs.shape
    n_blocks, groups = k // BLOCK, -(-o // GROUP)
    pad = groups * GROUP - o
    qs = np.concatenate([qs, np.zeros((pad, k), np.int8)]) if pad else qs
    quads = qs.reshape(groups, GROUP, n_blocks, BLOCK // 4, 4)
    packed = np.ascontiguousarray(quads.transpose(0, 2, 3, 1, 4))  # [G, nb, 8, rows, 4]
    packed ^= np.int8(_Q8A8_FLIP)
    return packed.reshape(groups, n_blocks, Q8_BLOCK_BYTES), _group_scales(scales, groups)


def pack_q4_groups(qs: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-major q4 (engine/quant.py: qs uint8 [O, K/2], scales [O, K/32]) -> (packed, gscales)
    as in the module docstring. Rows are padded to a multiple of GROUP with zero weights."""
    o, half = qs.shape
    n_blocks = half // 16
    groups = -(-o // GROUP)
    pad = groups * GROUP - o
    qs = np.concatenate([qs, np.full((pad, half), 0x88, np.uint8)]) if pad else qs
    blocks = qs.reshape(groups, GROUP, n_blocks, 16)
    weights = np.concatenate([blocks & 15, blocks >> 4], axis=3)  # [G, rows, nb, 32] in order
    weights = weights.transpose(0, 2, 1, 3)  # [G, nb, rows, 32]
    packed = np.empty((groups, n_blocks, 4, GROUP, 4), np.uint8)
    for j in range(4):
        low = weights[:, :, :, 4 * j : 4 * j + 4]
        high = weights[:, :, :, 16 + 4 * j : 16 + 4 * j + 4]
        packed[:, :, j] = low | (high << 4)
    return packed.reshape(groups, n_blocks, Q4_BLOCK_BYTES), _group_scales(scales, groups)


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


def matmul_q8a8g_reference(x, qs, scales):
    """Naive twin of matmul_q8a8g on the row-major q8 it was packed from: activations
    quantized to int8 as there, float64 product."""
    return _small_n_reference(dequantize_q8_reference, np.int8, x, qs, scales)


def matmul_q8g_reference(x, qs, scales):
    """Naive twin of matmul_q8g on the row-major q8 it was packed from: activations quantized
    to int16 as there, float64 product."""
    return _small_n_reference(dequantize_q8_reference, np.int16, x, qs, scales)
