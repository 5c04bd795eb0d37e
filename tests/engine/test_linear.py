"""Weight containers (engine/linear.py): which kernel a product of N rows runs. Grouped q8
where its int16 dots trail sgemm (qgroup.Q8_DOTS_PREFILL false: 8-row groups) prefills
through BLAS on dequantized weights, like row-major q8, and keeps the dot kernel for decode
and verify; everywhere else a grouped matrix runs its kernel at any N."""

import numpy as np
import pytest

from merlin.engine import linear
from merlin.engine.kernels import qgroup
from merlin.engine.kernels.reference import dequantize_q8_reference
from merlin.engine.quant import quantize_q4, quantize_q8

rng = np.random.default_rng(3)
O, K = 70, 2048 + 32


@pytest.fixture(scope="module")
def q8():
    return quantize_q8(rng.standard_normal((O, K), dtype=np.float32))


def product(lin, x):
    out = np.full((len(x), lin.out_features), np.nan, np.float32)
    lin(x, out)
    return out


def kernel_rows(lin, x):
    out = np.empty((len(x), lin.out_features), np.float32)
    qgroup.matmul_q8g(x, lin.packed, lin.gscales, out)
    return out


def test_q8_in_8_row_groups_prefills_through_blas(q8, monkeypatch):
    monkeypatch.setattr(linear, "Q8_DOTS_PREFILL", False)
    lin = linear.GroupLinear.from_qtensor(q8)
    assert linear.prefill_dequantizes(lin)
    x = rng.standard_normal((linear.SMALL_N + 9, K), dtype=np.float32)
    got = product(lin, x)
    want = x.astype(np.float64) @ dequantize_q8_reference(q8.qs, q8.scales).T.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # not the dot kernel (its int16 activations round x): BLAS on the exact weights
    assert not np.array_equal(got, kernel_rows(lin, x))
    # decode and verify keep the dot kernel, bit for bit
    small = x[: linear.SMALL_N]
    assert np.array_equal(product(lin, small), kernel_rows(lin, small))


def test_grouped_weights_run_their_kernel_at_any_n(q8, monkeypatch):
    monkeypatch.setattr(linear, "Q8_DOTS_PREFILL", True)
    lin = linear.GroupLinear.from_qtensor(q8)
    assert not linear.prefill_dequantizes(lin)
    x = rng.standard_normal((linear.SMALL_N + 9, K), dtype=np.float32)
    assert np.array_equal(product(lin, x), kernel_rows(lin, x))
    monkeypatch.setattr(linear, "Q8_DOTS_PREFILL", False)  # q4 and q8a8 never dequantize
    q4 = linear.GroupLinear.from_qtensor(quantize_q4(rng.standard_normal((O, K), np.float32)))
    assert not linear.prefill_dequantizes(q4)
    assert not linear.prefill_dequantizes(linear.GroupLinear.from_qtensor(q8, "q8a8"))
