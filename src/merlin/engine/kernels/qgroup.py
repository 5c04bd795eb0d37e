"""q4_0 and q8_0 weight products in groups of GROUP output rows: decode, verify and prefill.

    out[n, o] = sum_b fma(float(dot_b(w[o], xq[n])) * dx[n, b], wscale[o, b], acc)

for blocks b = 0, 1, ... of 32 weights, with the activations quantized per block
(actquant.py: int8 for q4 and q8a8, int16 for q8). GROUP (kernels/target.py) is 16 on
x86-avx512vnni, 8 on the other classes. Layouts (pack_* from the row-major formats of
engine/quant.py; a matrix whose row count is not a multiple of GROUP gets zero rows):

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

One slice holds 4 (q4, q8a8) or 2 (q8) weights of every row of the group, so one integer dot
(dots.py, per CPU class) with the activations broadcast adds up all G rows at once, and the
conversion, the scale and the fma are shared by the G rows. The q4 nibbles stay unsigned; the
-8 (and q8a8's bias) is taken out exactly by starting each block's sum at corr = -8 x (sum of
the block's activations).

Invariants: every product is an exact integer and per (n, o) the float operations are the
same sequence whatever N, the register tile or the thread count (parallel over groups only),
so row n of an N-row call is bitwise equal to a 1-row call, and the same on every CPU class
with the same GROUP. Prefill runs the same kernel (passes of ROW_CHUNK rows), so prefill rows
equal decode rows too. Each register tile is one intrinsic (group_tile_block) per block for
all its activation rows, the loop over weight slices outside the loop over rows.

Measurements behind the constants (tile sizes, prefetch distances, chains, row chunk) and the
assembly of each class: docs/kernels.md.
"""

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange
from numba.core import types
from numba.extending import intrinsic, overload

from . import dots
from .actquant import quantize_activations
from .irtools import (
    BLOCK,
    I8,
    I16,
    I32,
    QFASTMATH,
    bf16_vector_to_f32,
    call,
    emit_prefetch,
    load_vector,
    opaque,
    pick,
    scale_to_f32,
    splat,
    stack_f32,
    vec,
)
from .target import TARGET

DOT = TARGET.dot
GROUP = TARGET.group  # output rows per group: one int32 lane each
SLICE = 4 * GROUP  # bytes per slice: 4 weights of each row of the group
Q4_BLOCK_BYTES = 4 * SLICE  # one q4 block (32 weights) of the group's rows
Q8_BLOCK_BYTES = BLOCK * GROUP  # one q8 block of the group's rows
# q8a8's 4-byte dot takes unsigned weights on vpdpbusd and in the generic IR: stored there as
# w + 128 (the sign bit flipped) and taken out like the q4 nibbles' +8; signed elsewhere.
Q8A8_BIAS = 0 if dots.SIGNED_QUADS else 128
_Q8A8_FLIP = -Q8A8_BIAS  # w + 128 mod 256 is w with its sign bit flipped: w ^ -128
# Is the grouped q8 (int16 activations) the model's q8 kernel on this class, or the row-major
# qlinear.matmul_q8? Grouped on every tuned x86 class: faster for one row and much faster for
# a verify (docs/kernels.md); aarch64 keeps the row-major kernel (the grouped q8 there is
# built and tested under qemu, not timed on a core).
Q8_GROUPED = TARGET.x86_ir
# Do grouped q8 products of more than a few rows (a prefill) run the int16 dots too? With
# 16-row groups they outrun sgemm on dequantized weights at every N; with 256-bit vectors they
# trail it from ~64 rows, so there a prefill goes through BLAS as the row-major q8's does
# (engine/linear.py).
Q8_DOTS_PREFILL = GROUP == 16
# part of the weight cache's key: the class decides group size, bias and q8 layout
LAYOUT = f"{TARGET.name}-g{GROUP}" + ("q8g" if Q8_GROUPED else "") + f"b{Q8A8_BIAS}"
# high nibbles by a 16-bit shift and a mask instead of vgf2p8affineqb on Zen 4 (docs/kernels.md)
_SHIFT_IN_WORDS = DOT == "vnni" and TARGET.cpu_name.startswith("znver")
# activation words as lanes of a loaded block (sdot's by-element form) rather than one ld1r
# each: an ld1r also takes a vector pipe on the Cortex-A76 and needs an address add of its own
# (it has no offset form); llvm-mca's cycles a block, docs/kernels.md
BY_LANE = DOT == "sdot"
# activation rows per register tile: 8 x 16 lanes of accumulators with AVX-512's 32 registers,
# 4 x 8 lanes elsewhere; but VERIFY_ROWS rows (a verify of 4 drafts, the engine's default)
# left over are one tile on every class, never a TILE_ROWS tile and the rest (_group_rows)
TILE_ROWS = 8 if GROUP == 16 else 4
VERIFY_ROWS = 5
ACC_FLOATS = max(TILE_ROWS, VERIFY_ROWS) * GROUP
# activation rows per pass over the weights in a prefill: a pass's int8 activations and
# scales stay in L2 (32 rows of K = 6144: 240 KB)
ROW_CHUNK = 32


def small_tiles_into_l1(target) -> bool:
    """Do tiles of 1-2 activation rows prefetch their weights into L1 (AMD Zen: into L2 was
    slower on Zen 4; aarch64: not measured) or, like larger tiles, into L2 (Intel: 6-14%
    faster on a Sapphire Rapids-class Xeon, the one Intel core measured)? docs/kernels.md."""
    return not target.x86 or target.cpu_name.startswith("znver")


def own_row_pointers(target, kind: str, rows: int) -> bool:
    """Does a tile keep each activation row's address in a register of its own (irtools.opaque),
    so that its dots' broadcast operands are register + displacement? On x86 AVX-512 VNNI, for
    tiles of 5+ rows and, for the int8-activation formats (q4, q8a8), of 2: left to LLVM, the
    rows share one index register, and on Intel a dot with a base + index operand is
    un-laminated into two uops, which slows the verify and prefill tiles (q8's 8-row tile most:
    128 int16 dots a block). Not tiles of 3-4 rows nor q8's 2-4 (slower from DRAM in the
    model, though faster in cache), nor one row (no faster), nor the other classes (their dots
    take registers: AVX2 and AVX-VNNI have no embedded broadcast, aarch64 no indexed ld1r).
    The A/Bs behind each choice: docs/kernels.md, "The verify tile against DRAM"."""
    return target.name == "x86-avx512vnni" and (rows >= 5 or (rows == 2 and kind != "q8"))


# software prefetch in a thread's weights (one sequential stream a thread): L2_PREFETCH bytes
# ahead into L2; tiles of up to L1_PREFETCH_ROWS rows into L1, STREAM_PREFETCH ahead
STREAM_PREFETCH = 4096
L2_PREFETCH = 8192
L1_PREFETCH_ROWS = 2 if small_tiles_into_l1(TARGET) else 0


def _prefetch_for(rows: int) -> tuple[int, int]:
    """(bytes ahead, llvm.prefetch locality: 3 into L1, 2 into L2) for a tile of `rows`
    activation rows."""
    return (STREAM_PREFETCH, 3) if rows <= L1_PREFETCH_ROWS else (L2_PREFETCH, 2)


def _chains(rows: int) -> int:
    """Independent partial sums per activation row and block: 2 hide the dot latency; with
    8-row groups tiles of 3 or more rows take 1 (their rows are the parallelism, and two
    chains a row spilled NEON's registers)."""
    return 2 if GROUP == 16 or rows <= 2 else 1


_VI32 = vec(I32, GROUP)
_VI8 = vec(I8, SLICE)
_VI16 = vec(I16, SLICE // 2)
_VF = vec(ir.FloatType(), GROUP)


class _BlockWords:
    """One activation row's 8 words (4 int8 each) of a block, a word wanted in every lane of a
    dot: a broadcast load each (x86's dots take it as an embedded broadcast) or, where BY_LANE,
    the block loaded once as two 128-bit vectors and a word taken as a lane of one, which LLVM
    folds into sdot's by-element form."""

    def __init__(self, builder, words):
        self.builder, self.words = builder, words
        self.vectors = None
        if BY_LANE:
            self.vectors = [
                load_vector(builder, builder.gep(words, [I32(4 * i)]), I32, 4) for i in range(2)
            ]

    def word(self, index):
        """Word `index` in every lane (GROUP lanes)."""
        if self.vectors is None:
            word = self.builder.load(self.builder.gep(self.words, [I32(index)]), align=1)
            return splat(self.builder, word, _VI32)
        return pick(self.builder, self.vectors[index // 4], [index % 4] * GROUP)


def _high_nibbles(builder, w, low):
    """w >> 4 bytewise (a 16-bit shift and a mask where _SHIFT_IN_WORDS: Zen 4 runs LLVM's
    vgf2p8affineqb on the pipes the dots need)."""
    if not _SHIFT_IN_WORDS:
        return builder.lshr(w, ir.Constant(_VI8, [4] * SLICE))
    words = builder.bitcast(w, _VI16)
    shifted = builder.lshr(words, ir.Constant(_VI16, [4] * (SLICE // 2)))
    return builder.and_(builder.bitcast(shifted, _VI8), low)


def _load_slice(builder, w_base, offset, vtype):
    ptr = builder.gep(w_base, [I32(offset)])
    return builder.load(builder.bitcast(ptr, vtype.as_pointer()), align=1)


def _q4_tile_ints(builder, w_base, x_words, corrs):
    """The int32 block dots of the group's rows with each activation row r (x_words[r]), q4:
    per slice the nibbles are unpacked once and go to every row (dots.NibbleSums)."""
    rows = [dots.NibbleSums(builder, corr, GROUP, _chains(len(x_words))) for corr in corrs]
    blocks = [_BlockWords(builder, words) for words in x_words]
    low = ir.Constant(_VI8, [15] * SLICE)
    for j in range(4):
        w = _load_slice(builder, w_base, SLICE * j, _VI8)
        halves = (builder.and_(w, low), _high_nibbles(builder, w, low))
        for words, row in zip(blocks, rows):
            for nibbles, word in zip(halves, (j, 4 + j)):
                xs = builder.bitcast(words.word(word), _VI8)
                row.add(nibbles, xs)
    return [row.total() for row in rows]


def _chain_starts(builder, corrs, n_rows):
    """Per row: _chains(n_rows) int32 partial sums, the first starting from corr (if given)."""
    per_row = _chains(n_rows)
    zero = ir.Constant(_VI32, [0] * GROUP)
    if corrs is None:
        return [[zero] * per_row for _ in range(n_rows)]
    return [[splat(builder, c, _VI32)] + [zero] * (per_row - 1) for c in corrs]


def _q8_tile_ints(builder, w_base, x_words):
    """The q8 twin of _q4_tile_ints: 16 slices of 2 weights a row (int16 activations)."""
    chains = _chain_starts(builder, None, len(x_words))
    for j in range(BLOCK // 2):
        w = _load_slice(builder, w_base, 2 * GROUP * j, vec(I8, 2 * GROUP))
        for words, row in zip(x_words, chains):
            word = builder.load(builder.gep(words, [I32(j)]), align=1)
            row[j % len(row)] = dots.dot2(builder, row[j % len(row)], w, word)
    return [_sum(builder, row) for row in chains]


def _q8a8_tile_ints(builder, w_base, x_words, corrs):
    """The q8a8 twin of _q4_tile_ints: 8 slices of 4 (biased) weights a row, no unpacking;
    chains start from corr (the bias taken out)."""
    chains = _chain_starts(builder, corrs, len(x_words))
    blocks = [_BlockWords(builder, words) for words in x_words]
    for j in range(BLOCK // 4):
        w = _load_slice(builder, w_base, SLICE * j, _VI8)
        for words, row in zip(blocks, chains):
            xs = builder.bitcast(words.word(j), _VI8)
            row[j % len(row)] = dots.dot4(builder, row[j % len(row)], w, xs)
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
    sum). Also prefetches the weights ahead (_prefetch_for)."""
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
            emit_prefetch(builder, builder.gep(w_base, [I32(ahead + line)]), locality)
        x_base = builder.gep(data(3, xq_v), [xi_v])
        offsets = [builder.mul(xs_v, ir.Constant(xs_v.type, r)) for r in range(n_rows)]
        x_words = [builder.bitcast(builder.gep(x_base, [off]), I32.as_pointer()) for off in offsets]
        own_pointers = own_row_pointers(TARGET, kind, n_rows)
        if own_pointers:
            x_words = [opaque(builder, words) for words in x_words]
        d_offsets = [
            builder.add(di_v, builder.mul(ds_v, ir.Constant(ds_v.type, r))) for r in range(n_rows)
        ]
        if kind == "q8":
            ints = _q8_tile_ints(builder, w_base, x_words)
        else:
            corr_data = data(6, corr_v)
            corrs = [builder.load(builder.gep(corr_data, [off])) for off in d_offsets]
            tile_ints = _q4_tile_ints if kind == "q4" else _q8a8_tile_ints
            ints = tile_ints(builder, w_base, x_words, corrs)
        s_ptr = builder.gep(data(10, gs_v), [si_v])
        bits = builder.load(builder.bitcast(s_ptr, vec(I16, GROUP).as_pointer()), align=2)
        scales = bf16_vector_to_f32(builder, bits)
        dx_data = data(7, dx_v)
        for r, (dot, off) in enumerate(zip(ints, d_offsets)):
            dx_ptr = builder.gep(dx_data, [off])
            dx_r = builder.load(opaque(builder, dx_ptr) if own_pointers else dx_ptr)
            scaled = builder.fmul(builder.sitofp(dot, _VF), splat(builder, dx_r, _VF))
            a_ptr = builder.bitcast(builder.gep(acc_p, [I32(GROUP * r)]), _VF.as_pointer())
            fma_args = [scaled, scales, builder.load(a_ptr)]
            builder.store(call(builder, f"llvm.fma.v{GROUP}f32", _VF, fma_args), a_ptr)
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


@njit(nogil=True, cache=True, inline="always")
def next_tile(rest, tile_rows):
    """Rows of the next register tile when `rest` activation rows are left: tile_rows, but
    VERIFY_ROWS left are one tile, and fewer than tile_rows one tile of the rest."""
    return tile_rows if rest >= tile_rows and rest != VERIFY_ROWS else rest


def tile_sizes(n: int, tile_rows: int = TILE_ROWS) -> list[int]:
    """The register tiles _group_rows cuts n activation rows into, for a class whose tiles
    are tile_rows rows (bench/board.py models other classes' with it)."""
    sizes = []
    while n:
        sizes.append(next_tile.py_func(n, tile_rows))
        n -= sizes[-1]
    return sizes


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _group_rows(packed, gscales, xq, dx, corr, g, r0, r1, out):
    """Group g against activation rows r0..r1: register tiles of TILE_ROWS rows, then the
    rest, each size a separate unrolled copy (next_tile, tile_sizes). Five rows left are one tile on
    every class: as a 4-row and a 1-row tile the second pass unpacks the group's weights
    again and runs its dots apart, 12-16% slower for q4 on the 8-row x86 classes (5 rows of
    q8 with 16-row groups were 4 + 1 until own_row_pointers made one tile as fast or faster;
    docs/kernels.md)."""
    n0 = r0
    while n0 < r1:
        nr = next_tile(r1 - n0, TILE_ROWS)
        if nr == TILE_ROWS:
            _tile(packed, gscales, xq, dx, corr, g, n0, TILE_ROWS, out)
        elif nr == 7:
            _tile(packed, gscales, xq, dx, corr, g, n0, 7, out)
        elif nr == 6:
            _tile(packed, gscales, xq, dx, corr, g, n0, 6, out)
        elif nr == 5:
            _tile(packed, gscales, xq, dx, corr, g, n0, 5, out)
        elif nr == 4:
            _tile(packed, gscales, xq, dx, corr, g, n0, 4, out)
        elif nr == 3:
            _tile(packed, gscales, xq, dx, corr, g, n0, 3, out)
        elif nr == 2:
            _tile(packed, gscales, xq, dx, corr, g, n0, 2, out)
        else:
            _tile(packed, gscales, xq, dx, corr, g, n0, 1, out)
        n0 += nr


# A matrix of at most this many packed bytes stays in a core's L2 through a whole product:
# _grouped then runs its passes inside one parallel region
SMALL_MATRIX_BYTES = 1 << 20


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _grouped(packed, gscales, xq, dx, corr, out):
    """All groups (parallel) against all activation rows. Many rows (a prefill) go in
    passes of ROW_CHUNK, each over all the weights: a pass's activations stay in L2 while a
    group's weights, read from DRAM by its first tile, serve its other tiles from L1/L2. A
    small matrix (SMALL_MATRIX_BYTES: it stays cached anyway) runs the same passes group by
    group in one parallel region instead of one region a pass, whose start-up cost more
    than a small pass's work (the demo model's vision encoder: 784 rows of 96-384-wide
    products, 84 of its 118 ms on two threads). The same tiles either way: the same bits."""
    n_rows = xq.shape[0]
    if packed.size <= SMALL_MATRIX_BYTES:
        for g in prange(packed.shape[0]):
            for r0 in range(0, n_rows, ROW_CHUNK):
                r1 = min(n_rows, r0 + ROW_CHUNK)
                _group_rows(packed, gscales, xq, dx, corr, g, r0, r1, out)
        return
    for r0 in range(0, n_rows, ROW_CHUNK):
        r1 = min(n_rows, r0 + ROW_CHUNK)
        for g in prange(packed.shape[0]):
            _group_rows(packed, gscales, xq, dx, corr, g, r0, r1, out)


# The work of one (expert, group) task of _grouped_experts in activation rows: a group's
# weights cost about one register tile's dots to read from memory.
_TASK_WEIGHT_ROWS = TILE_ROWS


@njit(nogil=True, cache=True)
def _task_split(starts, n_groups, threads):
    """Bounds [threads + 1] of contiguous runs of the (expert j, group g) tasks, t = j
    n_groups + g, of about equal work (expert j's rows starts[j + 1] - starts[j] plus
    _TASK_WEIGHT_ROWS, per group): experts of many rows and of one share the threads evenly."""
    used = starts.shape[0] - 1
    total = 0
    for j in range(used):
        total += (starts[j + 1] - starts[j] + _TASK_WEIGHT_ROWS) * n_groups
    bounds = np.empty(threads + 1, np.int64)
    bounds[0] = 0
    th, done, t = 1, 0, 0
    for j in range(used):
        cost = starts[j + 1] - starts[j] + _TASK_WEIGHT_ROWS
        for _ in range(n_groups):
            done += cost
            t += 1
            while th < threads and done * threads >= total * th:
                bounds[th] = t
                th += 1
    while th <= threads:
        bounds[th] = t
        th += 1
    return bounds


@njit(nogil=True, cache=True, fastmath=QFASTMATH, inline="always")
def _grouped_experts(packed, gscales, chosen, starts, xq, dx, corr, threads, out):
    """For each j: rows starts[j]..starts[j + 1] of xq against expert chosen[j]'s matrix
    (packed, gscales stacked on a leading expert axis), into the same rows of out. One
    parallel region over all (expert, group) tasks (_task_split), instead of one region a
    product: a decode step's 16 products a layer are each too small for a region of their
    own (docs/moe.md). Each (row, output) is computed by _group_rows as in _grouped."""
    n_groups = packed.shape[1]
    bounds = _task_split(starts, n_groups, threads)
    for th in prange(threads):
        for t in range(bounds[th], bounds[th + 1]):
            j, g = divmod(t, n_groups)
            e = chosen[j]
            _group_rows(packed[e], gscales[e], xq, dx, corr, g, starts[j], starts[j + 1], out)


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


@njit(nogil=True, cache=True, inline="always")
def _int8_activations(x, bias):
    """x [N, K] quantized per block to int8 (q4, q8a8): (xq, dx, corr), corr taking out the
    weights' stored +bias."""
    n_rows, k_dim = x.shape
    xq = np.empty((n_rows, k_dim), np.int8)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    corr = np.empty((n_rows, k_dim // BLOCK), np.int32)
    quantize_activations(x, xq, dx)
    _offset_sums(xq, bias, corr)
    return xq, dx, corr


@njit(nogil=True, cache=True, inline="always")
def _int16_activations(x):
    """x [N, K] quantized per block to int16 (q8): (xq, dx, corr), corr unread by q8 (no
    zeroing per call)."""
    n_rows, k_dim = x.shape
    xq = np.empty((n_rows, k_dim), np.int16)
    dx = np.empty((n_rows, k_dim // BLOCK), np.float32)
    corr = np.empty((n_rows, k_dim // BLOCK), np.int32)
    quantize_activations(x, xq, dx)
    return xq, dx, corr


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q4g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q4 (pack_q4_groups), x quantized per
    block to int8 here. x: [N, K] f32 C-contiguous; out: [N, O] f32, O <= GROUP x groups."""
    _check_shapes(x, packed, gscales, out, Q4_BLOCK_BYTES)
    xq, dx, corr = _int8_activations(x, 8)
    _grouped(packed, gscales, xq, dx, corr, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q8g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q8 (pack_q8_groups), x quantized per
    block to int16 here. x: [N, K] f32 C-contiguous; out: [N, O] f32, O <= GROUP x groups."""
    _check_shapes(x, packed, gscales, out, Q8_BLOCK_BYTES)
    xq, dx, corr = _int16_activations(x)
    _grouped(packed, gscales, xq, dx, corr, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def matmul_q8a8g(x, packed, gscales, out):
    """out[n, o] = sum_k x[n, k] * w[o, k], w in grouped q8a8 (pack_q8a8_groups), x quantized
    per block to int8 here (as for q4: half the dot instructions of q8's int16). x: [N, K]
    f32 C-contiguous; out: [N, O] f32, O <= GROUP x groups."""
    _check_shapes(x, packed, gscales, out, Q8_BLOCK_BYTES)
    xq, dx, corr = _int8_activations(x, Q8A8_BIAS)
    _grouped(packed, gscales, xq, dx, corr, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def experts_q4g(x, packed, gscales, chosen, starts, threads, out):
    """out[starts[j] : starts[j + 1]] = the same rows of x times expert chosen[j]'s grouped
    q4 matrix, for every j: packed [E, O/G, K/32, 16 G], gscales [E, O/G, K/32, G] (one
    layer's experts, engine/kernels/experts.py); x [P, K] f32, out [P, O] f32; threads: the
    parallel region's runs (numba.get_num_threads()). Row n equals matmul_q4g on that row
    alone, bit for bit."""
    _check_shapes(x, packed[0], gscales[0], out, Q4_BLOCK_BYTES)
    xq, dx, corr = _int8_activations(x, 8)
    _grouped_experts(packed, gscales, chosen, starts, xq, dx, corr, threads, out)


@njit(nogil=True, cache=True, fastmath=QFASTMATH, parallel=True)
def experts_q8g(x, packed, gscales, chosen, starts, threads, out):
    """experts_q4g for grouped q8 matrices (int16 activations): row n equals matmul_q8g."""
    _check_shapes(x, packed[0], gscales[0], out, Q8_BLOCK_BYTES)
    xq, dx, corr = _int16_activations(x)
    _grouped_experts(packed, gscales, chosen, starts, xq, dx, corr, threads, out)


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


def experts_grouped(x, packed, gscales, chosen, starts, threads, out):
    """experts_q4g or experts_q8g, by the packed weights' type (uint8: q4, int8: q8), for
    code compiled once for both (engine/kernels/experts.py)."""


@overload(experts_grouped)
def _experts_grouped_impl(x, packed, gscales, chosen, starts, threads, out):
    if packed.dtype == types.uint8:

        def q4(x, packed, gscales, chosen, starts, threads, out):
            experts_q4g(x, packed, gscales, chosen, starts, threads, out)

        return q4

    def q8(x, packed, gscales, chosen, starts, threads, out):
        experts_q8g(x, packed, gscales, chosen, starts, threads, out)

    return q8
