"""Block-quantized weights (engine/quant.py) and the q8 kernels (engine/kernels/qlinear.py):
round-trip error bounds, every kernel against its naive twin, and the property speculative
decoding rests on: row i of an N-row product is bitwise equal to a 1-row product on x[i], for
any N and thread count. The grouped kernels: tests/engine/kernels/test_qgroup.py; every CPU class's
build of both: tests/engine/kernels/test_classes.py."""

import numba
import numpy as np
import pytest

from merlin.engine import quant
from merlin.engine.kernels import actquant, reference
from merlin.engine.kernels import qlinear as ql

rng = np.random.default_rng(0)


def weights(o, k, scale=0.05):
    """Gaussian rows with a spread of magnitudes, a few outliers and an all-zero block."""
    w = rng.standard_normal((o, k), dtype=np.float32) * scale
    w *= np.exp(rng.uniform(-3, 2, (o, 1))).astype(np.float32)
    w[rng.random((o, k)) < 1e-3] *= 20
    w[0, :32] = 0.0
    return w


def close(out, ref, rtol=2e-6):
    """Agreement relative to the size of the whole output (f32 accumulation vs float64)."""
    err = np.abs(out.astype(np.float64) - ref).max()
    assert err <= rtol * np.abs(ref).max() * np.sqrt(ref.shape[-1]) + 1e-30, err


@pytest.fixture(scope="module")
def mats():
    """q8 weights by shape (O, K)."""
    return {
        (o, k): quant.quantize_q8(weights(o, k)) for o, k in [(70, 2048 + 32), (33, 64), (5, 32)]
    }


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize("k", [32, 64, 2048 + 32])
def test_q8_roundtrip_error_within_half_a_step(k):
    w = weights(37, k)
    qt = quant.quantize_q8(w)
    assert qt.qs.dtype == np.int8 and qt.qs.shape == (37, k)
    assert qt.scales.dtype == np.uint16 and qt.scales.shape == (37, k // 32)
    assert qt.qs.min() >= -127
    s = quant.scales_f32(qt)
    assert (s >= 0).all()
    err = np.abs(quant.dequantize(qt) - w).reshape(37, -1, 32)
    assert (err <= s[:, :, None] * (0.5 + 1e-5)).all()
    # the scale is at most one bf16 step above absmax / 127
    amax = np.abs(w).reshape(37, -1, 32).max(axis=2)
    assert (s >= amax / 127).all() and (s <= amax / 127 * (1 + 2**-7)).all()
    assert np.all(quant.dequantize(qt)[0, :32] == 0)
    stats = quant.error_stats(w, qt)
    assert stats["max_err_over_scale"] <= 0.5 + 1e-5
    assert stats["rel_rms_err"] < 0.02 and stats["bytes_per_weight"] == 1.0625


@pytest.mark.parametrize("k", [32, 64, 2048 + 32])
def test_q4_roundtrip_error_bounds(k):
    w = weights(37, k)
    qt = quant.quantize_q4(w)
    assert qt.qs.dtype == np.uint8 and qt.qs.shape == (37, k // 2)
    q = quant.unpack_q4(qt.qs)
    assert q.min() >= -8 and q.max() <= 7
    s = np.abs(quant.scales_f32(qt))[:, :, None]
    err = np.abs(quant.dequantize(qt) - w).reshape(37, -1, 32)
    assert (err <= s * (1 + 1e-5)).all()  # the clipped top of the range: at most one step
    unclipped = q.reshape(37, -1, 32) < 7
    assert (err[unclipped] <= (s * np.ones_like(err))[unclipped] * (0.5 + 1e-5)).all()
    # the value of largest magnitude in each block is represented (nearly) exactly as -8 s
    blocks = w.reshape(37, -1, 32)
    idx = np.abs(blocks).argmax(axis=2)[:, :, None]
    extreme = np.take_along_axis(q.reshape(37, -1, 32), idx, 2)[:, :, 0]
    nonzero = np.abs(blocks).max(axis=2) > 0
    assert (extreme[nonzero] == -8).all() and (extreme[~nonzero] == 0).all()
    stats = quant.error_stats(w, qt)
    assert stats["rel_rms_err"] < 0.2 and stats["bytes_per_weight"] == 0.5625


def test_q4_packing_order():
    """Byte j of a block holds weight j (low nibble) and weight 16 + j (high nibble), each as
    q + 8; a block whose extreme is -8 s with s exact in bf16 round-trips exactly."""
    q_true = np.concatenate([np.arange(-8, 8), np.arange(7, -9, -1)]).astype(np.float32)
    w = np.concatenate([q_true * 0.5, q_true[::-1] * 0.25])[None, :]
    qt = quant.quantize_q4(w)
    np.testing.assert_array_equal(quant.scales_f32(qt), [[0.5, 0.25]])
    np.testing.assert_array_equal(quant.dequantize(qt), w)
    u = (q_true + 8).astype(np.uint8)
    np.testing.assert_array_equal(qt.qs[0, :16], u[:16] | (u[16:] << 4))
    np.testing.assert_array_equal(
        quant.dequantize(qt), reference.dequantize_q4_reference(qt.qs, qt.scales)
    )


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_k_not_multiple_of_block_raises(fmt):
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize(np.ones((4, 48), np.float32), fmt)
    with pytest.raises(ValueError):
        quant.quantize(np.ones(64, np.float32), fmt)
    with pytest.raises(ValueError, match="inf or nan"):
        quant.quantize(np.full((2, 32), np.inf, np.float32), fmt)


def test_unknown_format_raises():
    with pytest.raises(ValueError, match="unknown"):
        quant.quantize(np.ones((4, 32), np.float32), "q3")


def test_bf16_scales_round_up():
    s = np.array([1.0, 1.0 + 2**-10, 3e-30, 0.0, -(1.0 + 2**-10)], np.float32)
    back = quant.bf16_to_f32(quant.bf16_round_up(s))
    assert (np.abs(back) >= np.abs(s)).all() and (np.abs(back) <= np.abs(s) * (1 + 2**-7)).all()
    assert back[0] == 1.0 and back[3] == 0.0 and back[4] < 0


def test_quantize_accepts_other_float_dtypes():
    w = weights(8, 64).astype(np.float16)
    a = quant.quantize_q8(w)
    b = quant.quantize_q8(w.astype(np.float32))
    assert np.array_equal(a.qs, b.qs) and np.array_equal(a.scales, b.scales)


# --------------------------------------------------------------------------- kernels vs twins


def test_dequantize_kernel_matches_reference(mats):
    for qt in mats.values():
        o, k = qt.shape
        out = np.empty((o - 1, k), np.float32)
        ql.dequantize_q8_rows(qt.qs, qt.scales, 1, out)
        ref = reference.dequantize_q8_reference(qt.qs, qt.scales)
        np.testing.assert_array_equal(out, ref[1:])
        np.testing.assert_array_equal(quant.dequantize(qt), ref)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9, 16])
def test_small_n_kernel_matches_reference(n, mats):
    for qt in mats.values():
        o, k = qt.shape
        x = rng.standard_normal((n, k), dtype=np.float32)
        out = np.full((n, o), np.nan, np.float32)
        ql.matmul_q8(x, qt.qs, qt.scales, out)
        close(out, reference.matmul_q8_small_reference(x, qt.qs, qt.scales).astype(np.float64))
        # activation quantization (q8_0): each x is off by at most half its block's step
        exact = reference.matmul_q8_reference(x, qt.qs, qt.scales).astype(np.float64)
        _, dx = reference.quantize_activations_reference(x, ql.XQ8_DTYPE)
        w = np.abs(reference.dequantize_q8_reference(qt.qs, qt.scales)).reshape(
            o, -1, reference.BLOCK
        )
        bound = (dx.astype(np.float64) / 2) @ w.sum(axis=2).T
        assert (np.abs(out - exact) <= bound * 1.001 + 1e-6 * np.abs(exact).max()).all()


@pytest.mark.parametrize("dtype,level", [(np.int16, 32767), (np.int8, 127)])
def test_activation_quantization_matches_twin(dtype, level):
    x = rng.standard_normal((3, 96), dtype=np.float32) * np.float32(3.0)
    x[1, :32] = 0.0  # an all-zero block gets scale 0, not a division by zero
    x[2, 40] = np.float32(1e30)
    xq = np.empty(x.shape, dtype)
    dx = np.empty((3, 3), np.float32)
    actquant.quantize_activations(x, xq, dx)
    ref_q, ref_d = reference.quantize_activations_reference(x, dtype)
    np.testing.assert_array_equal(xq, ref_q)
    np.testing.assert_array_equal(dx, ref_d)
    assert dx[1, 0] == 0.0
    # each block's largest value maps to +-level, so the step is the smallest possible
    assert (np.abs(xq.astype(np.int32)).reshape(3, 3, 32).max(axis=2)[dx > 0] == level).all()


def test_f32_scales_give_the_same_weights(mats):
    """Kernels also take float32 block scales (the layout benchmark times both); the decode
    is the same intrinsic in every kernel, so the cheap dequantize kernel checks it."""
    qt = mats[(33, 64)]
    a = np.empty(qt.shape, np.float32)
    b = np.empty_like(a)
    ql.dequantize_q8_rows(qt.qs, qt.scales, 0, a)
    ql.dequantize_q8_rows(qt.qs, quant.scales_f32(qt).copy(), 0, b)
    assert np.array_equal(a, b)


def test_prefill_matches_reference(mats, monkeypatch):
    monkeypatch.setattr(ql, "PREFILL_TILE_FLOATS", 2048 * 24)  # several tiles, a partial one
    for qt in mats.values():
        o, k = qt.shape
        x = rng.standard_normal((40, k), dtype=np.float32)
        out = np.full((40, o), np.nan, np.float32)
        ql.matmul_q8_prefill(x, qt.qs, qt.scales, out)
        close(out, reference.matmul_q8_reference(x, qt.qs, qt.scales).astype(np.float64))
        scratch = np.empty(ql.prefill_tile_rows(o, k) * k, np.float32)
        again = np.empty_like(out)
        ql.matmul_q8_prefill(x, qt.qs, qt.scales, again, scratch)
        assert np.array_equal(out, again)


def test_kernel_rejects_mismatched_shapes(mats):
    qt = mats[(33, 64)]
    with pytest.raises(ValueError):
        ql.matmul_q8(np.ones((1, 96), np.float32), qt.qs, qt.scales, np.empty((1, 33), np.float32))
    with pytest.raises(ValueError):
        ql.matmul_q8(np.ones((2, 64), np.float32), qt.qs, qt.scales, np.empty((1, 33), np.float32))


# --------------------------------------------------------------------------- determinism


def test_rows_do_not_depend_on_batch_or_threads(mats):
    """Row i of an N-row call equals a 1-row call on x[i], bit for bit, for N = 1..9 and
    1 or 2 threads (odd O: the 1-row output tail tile is covered too)."""
    qt = mats[(70, 2048 + 32)]
    o, k = qt.shape
    x = rng.standard_normal((9, k), dtype=np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        singles = []
        for i in range(9):
            row = np.empty((1, o), np.float32)
            ql.matmul_q8(x[i : i + 1], qt.qs, qt.scales, row)
            singles.append(row[0])
        singles = np.array(singles)
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS), before}):
            numba.set_num_threads(threads)
            for n in range(1, 10):
                out = np.empty((n, o), np.float32)
                ql.matmul_q8(np.ascontiguousarray(x[:n]), qt.qs, qt.scales, out)
                assert np.array_equal(out, singles[:n]), (threads, n)
    finally:
        numba.set_num_threads(before)
