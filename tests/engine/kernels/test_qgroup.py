"""Grouped q4, q8 and q8a8 kernels (engine/kernels/qgroup.py) against their twins, and the
properties speculative decoding relies on: rows independent of the batch and of the thread
count, on this host's CPU class. The other classes (and the 8-row layout): test_classes.py."""

import numba
import numpy as np
import pytest

from merlin.engine.kernels import qgroup, reference, target
from merlin.engine.kernels.actquant import quantize_activations
from merlin.engine.kernels.reference import dequantize_q4_reference, dequantize_q8_reference
from merlin.engine.quant import quantize_q4, quantize_q8

rng = np.random.default_rng(11)

# per format: quantize, pack, product, dequantize rows, twin, dequantized twin,
# activation dtype, packed bytes per block and row
KERNELS = {
    "q4": (
        quantize_q4,
        qgroup.pack_q4_groups,
        qgroup.matmul_q4g,
        qgroup.dequantize_q4g_rows,
        reference.matmul_q4g_reference,
        dequantize_q4_reference,
        np.int8,
        16,
    ),
    "q8": (
        quantize_q8,
        qgroup.pack_q8_groups,
        qgroup.matmul_q8g,
        qgroup.dequantize_q8g_rows,
        reference.matmul_q8g_reference,
        dequantize_q8_reference,
        np.int16,
        32,
    ),
    "q8a8": (
        quantize_q8,
        qgroup.pack_q8a8_groups,
        qgroup.matmul_q8a8g,
        qgroup.dequantize_q8a8g_rows,
        reference.matmul_q8a8g_reference,
        dequantize_q8_reference,
        np.int8,
        32,
    ),
}


@pytest.fixture(
    scope="module",
    params=[(f, s) for f in KERNELS for s in [(37, 96), (64, 256), (5, 32)]],
    ids=lambda p: f"{p[0]}-{p[1][0]}x{p[1][1]}",
)
def packed(request):
    fmt, (o, k) = request.param
    kernels = KERNELS[fmt]
    qt = kernels[0](rng.standard_normal((o, k), dtype=np.float32))
    return kernels, qt, kernels[1](qt.qs, qt.scales)


def test_groups_hold_the_same_weights(packed):
    (_, _, _, dequantize_rows, _, dequantize_ref, _, row_bytes), qt, (p, s) = packed
    o, k = qt.shape
    g = qgroup.GROUP
    assert p.shape == (-(-o // g), k // 32, row_bytes * g) and s.shape == (p.shape[0], k // 32, g)
    out = np.empty((o - 3, k), np.float32)
    dequantize_rows(p, s, 3, out)
    assert np.array_equal(out, dequantize_ref(qt.qs, qt.scales)[3:].astype(np.float32))
    with pytest.raises(ValueError):
        dequantize_rows(p, s, 4, np.empty((p.shape[0] * g - 3, k), np.float32))


def test_products_match_the_twin_and_do_not_depend_on_batch_or_threads(packed):
    """N = 1..17 covers every register-tile size, whole tiles and a rest."""
    (_, _, matmul, _, twin, _, _, _), qt, (p, s) = packed
    o, k = qt.shape
    n_max = 17
    x = rng.standard_normal((n_max, k), dtype=np.float32)
    x[2] = 0.0  # an all-zero row: zero scales, no division by zero
    ref = twin(x, qt.qs, qt.scales)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        singles = np.empty((n_max, o), np.float32)
        for i in range(n_max):
            matmul(x[i : i + 1], p, s, singles[i : i + 1])
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            for n in range(1, n_max + 1):
                out = np.empty((n, o), np.float32)
                matmul(np.ascontiguousarray(x[:n]), p, s, out)
                assert np.array_equal(out, singles[:n]), (threads, n)
    finally:
        numba.set_num_threads(before)
    assert np.abs(singles - ref).max() <= 1e-5 * np.abs(ref).max()
    assert not singles[2].any()


def exact_product(x, qt, dequantize_ref):
    """x @ w.T in float64 on the dequantized weights (no activation quantization)."""
    return x.astype(np.float64) @ dequantize_ref(qt.qs, qt.scales).T


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9, 16])
def test_error_is_within_the_activation_quantization(n, packed):
    """Off the exact product by at most what quantized activations cost (each x by at most
    half its block's step), and on the twin, which quantizes them the same way."""
    (_, _, matmul, _, twin, dequantize_ref, x_dtype, _), qt, (p, s) = packed
    o, k = qt.shape
    x = rng.standard_normal((n, k), dtype=np.float32)
    out = np.full((n, o), np.nan, np.float32)
    matmul(x, p, s, out)
    ref = twin(x, qt.qs, qt.scales)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    exact = exact_product(x, qt, dequantize_ref)
    _, dx = reference.quantize_activations_reference(x, x_dtype)
    w = np.abs(dequantize_ref(qt.qs, qt.scales)).reshape(o, -1, qgroup.BLOCK)
    bound = (dx.astype(np.float64) / 2) @ w.sum(axis=2).T
    assert (np.abs(out - exact) <= bound * 1.001 + 1e-6 * np.abs(exact).max()).all()


def test_prefill_sized_products_are_the_decode_rows(packed):
    """A prefill runs the same kernel in passes of ROW_CHUNK rows: with two passes and a
    rest tile every row is bitwise the 1-row product, and on the twin."""
    (_, _, matmul, _, twin, _, _, _), qt, (p, s) = packed
    o, k = qt.shape
    n = 2 * qgroup.ROW_CHUNK + 5
    x = rng.standard_normal((n, k), dtype=np.float32)
    out = np.full((n, o), np.nan, np.float32)
    matmul(x, p, s, out)
    single = np.empty((1, o), np.float32)
    for i in (0, qgroup.ROW_CHUNK - 1, qgroup.ROW_CHUNK, n - 1):
        matmul(x[i : i + 1], p, s, single)
        assert np.array_equal(out[i], single[0]), i
    ref = twin(x, qt.qs, qt.scales)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("bias", [8, 128])
def test_offset_sums(bias):
    """The weights' stored +bias taken out per block: -bias x the sum of its 32 activations
    (int32, no overflow at the extremes)."""
    xq = rng.integers(-127, 128, (3, 64)).astype(np.int8)
    xq[0, :32] = -127
    corr = np.empty((3, 2), np.int32)
    qgroup._offset_sums(xq, bias, corr)
    sums = xq.astype(np.int32).reshape(3, 2, 32).sum(axis=2)
    np.testing.assert_array_equal(corr, -bias * sums)
    assert corr[0, 0] == bias * 32 * 127


def test_q8a8_stores_biased_weights_at_the_extremes():
    """-128 and 127 survive the bias (a wrap, not a clip) and come back in the rows."""
    qt = quantize_q8(rng.standard_normal((qgroup.GROUP, 32), dtype=np.float32))
    qt.qs[0, :2] = [-128, 127]
    p, s = qgroup.pack_q8a8_groups(qt.qs, qt.scales)
    out = np.empty((1, 32), np.float32)
    qgroup.dequantize_q8a8g_rows(p, s, 0, out)
    assert np.array_equal(out, dequantize_q8_reference(qt.qs[:1], qt.scales[:1]))
    x = rng.standard_normal((1, 32), dtype=np.float32)
    got = np.empty((1, qgroup.GROUP), np.float32)
    qgroup.matmul_q8a8g(x, p, s, got)
    ref = reference.matmul_q8a8g_reference(x, qt.qs, qt.scales)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_shapes_are_checked(packed):
    (_, _, matmul, _, _, _, _, _), qt, (p, s) = packed
    o, k = qt.shape
    with pytest.raises(ValueError):
        matmul(np.ones((1, k + 32), np.float32), p, s, np.empty((1, o), np.float32))
    with pytest.raises(ValueError):
        matmul(np.ones((1, k), np.float32), p, s, np.empty((1, o + qgroup.GROUP), np.float32))
    out = np.empty((1, o), np.float32)
    with pytest.raises(numba.TypingError):  # the kernel reads the scales as bf16 bits
        matmul(np.ones((1, k), np.float32), p, s.astype(np.float32), out)


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_activations_must_be_c_contiguous(dtype):
    """The kernels' activations are quantized by quantize_activations, which refuses any other
    layout (checked on it alone: a kernel called with a strided x compiles a whole second
    specialization just to raise this)."""
    x = np.ones((64, 2), np.float32).T
    with pytest.raises(ValueError, match="C-contiguous"):
        quantize_activations(x, np.empty((2, 64), dtype), np.empty((2, 2), np.float32))


EXPERT_KERNELS = {"q4": qgroup.experts_q4g, "q8": qgroup.experts_q8g}


@pytest.mark.parametrize("fmt", list(EXPERT_KERNELS))
@pytest.mark.parametrize("rows", [[1], [3, 1, 9, 2], [0, 17, 1], [40, 1, 1, 6, 5]])
def test_expert_products_are_each_experts_own_product(fmt, rows):
    """experts_q4g / experts_q8g give, for each chosen expert, its rows' matmul_q4g /
    matmul_q8g bit for bit, whatever the split of the tasks over threads (more threads than
    tasks, one, an odd count) and however unevenly the rows fall on the experts."""
    quant, pack, matmul = KERNELS[fmt][0], KERNELS[fmt][1], KERNELS[fmt][2]
    n_experts, o, k = 6, 40, 96
    packs = [pack(*(lambda q: (q.qs, q.scales))(quant(rng.standard_normal((o, k), np.float32))))
             for _ in range(n_experts)]  # fmt: skip
    packed = np.stack([p for p, _ in packs])
    gscales = np.stack([s for _, s in packs])
    chosen = np.array([e for e, r in zip([4, 0, 5, 2, 3], rows) if r], np.int64)
    counts = [r for r in rows if r]
    runs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    x = rng.standard_normal((int(runs[-1]), k)).astype(np.float32)
    want = np.empty((x.shape[0], o), np.float32)
    for j, e in enumerate(chosen):
        matmul(x[runs[j] : runs[j + 1]].copy(), packed[e], gscales[e], want[runs[j] : runs[j + 1]])
    for threads in (1, 2, 3, 64):
        got = np.full_like(want, np.nan)
        EXPERT_KERNELS[fmt](x, packed, gscales, chosen, runs, threads, got)
        assert np.array_equal(got, want), threads


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_small_and_large_matrices_give_the_same_bits(fmt):
    """A matrix over SMALL_MATRIX_BYTES runs a parallel region per pass of ROW_CHUNK rows, a
    smaller one all its passes in one region: its first groups, alone, are a small matrix
    whose outputs must be the big one's first columns, bit for bit, for a prefill's rows."""
    quantize, pack, matmul = KERNELS[fmt][:3]
    k = 1024
    group_bytes = KERNELS[fmt][7] * qgroup.GROUP * (k // 32)
    groups = qgroup.SMALL_MATRIX_BYTES // group_bytes + 1
    qt = quantize(rng.standard_normal((groups * qgroup.GROUP, k), dtype=np.float32))
    packed, gscales = pack(qt.qs, qt.scales)
    assert packed.nbytes > qgroup.SMALL_MATRIX_BYTES
    few = 3
    assert packed[:few].nbytes <= qgroup.SMALL_MATRIX_BYTES
    x = rng.standard_normal((2 * qgroup.ROW_CHUNK + 7, k), dtype=np.float32)
    big = np.empty((len(x), packed.shape[0] * qgroup.GROUP), np.float32)
    matmul(x, packed, gscales, big)
    small = np.empty((len(x), few * qgroup.GROUP), np.float32)
    matmul(x, np.ascontiguousarray(packed[:few]), np.ascontiguousarray(gscales[:few]), small)
    assert np.array_equal(small, big[:, : few * qgroup.GROUP])


@pytest.mark.parametrize("tile_rows", [4, 8])
def test_a_verify_of_four_drafts_is_one_register_tile(tile_rows):
    """Five rows are never a 4-row and a 1-row tile; every row is in one tile of at most
    ACC_FLOATS accumulators."""
    assert qgroup.tile_sizes(qgroup.VERIFY_ROWS, tile_rows) == [qgroup.VERIFY_ROWS]
    assert qgroup.tile_sizes(tile_rows + 5, tile_rows) == [tile_rows, 5]
    assert qgroup.tile_sizes(6, tile_rows) == ([4, 2] if tile_rows == 4 else [6])
    for n in range(1, 40):
        sizes = qgroup.tile_sizes(n, tile_rows)
        assert sum(sizes) == n and all(sizes)
        assert max(sizes) <= max(tile_rows, qgroup.VERIFY_ROWS)
    assert max(qgroup.tile_sizes(qgroup.VERIFY_ROWS)) * qgroup.GROUP <= qgroup.ACC_FLOATS


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_task_split_covers_every_task_once_in_balanced_runs(threads):
    runs = np.array([0, 1, 41, 42, 50], np.int64)  # experts of 1, 40, 1 and 8 rows
    n_groups = 12
    bounds = qgroup._task_split(runs, n_groups, threads)
    assert bounds[0] == 0 and bounds[-1] == 4 * n_groups
    assert np.all(np.diff(bounds) >= 0)
    cost = np.repeat(np.diff(runs) + qgroup._TASK_WEIGHT_ROWS, n_groups)
    per_thread = [cost[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
    # each run is within one task of an even share
    assert max(per_thread) <= cost.sum() / threads + cost.max()


@pytest.mark.parametrize(
    "env, machine, into_l1",
    [
        ({"NUMBA_CPU_NAME": "haswell"}, "x86_64", False),
        ({"NUMBA_CPU_NAME": "icelake-server"}, "x86_64", False),
        ({"NUMBA_CPU_NAME": "znver3"}, "x86_64", True),
        ({"NUMBA_CPU_NAME": "znver4"}, "x86_64", True),
        ({"NUMBA_CPU_NAME": "cortex-a76"}, "aarch64", True),
    ],
)
def test_small_tiles_prefetch_into_l1_on_amd_and_arm_into_l2_on_intel(env, machine, into_l1):
    assert qgroup.small_tiles_into_l1(target.detect(env, machine)) == into_l1
