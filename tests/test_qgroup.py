"""Grouped q4 kernels (engine/kernels/qgroup.py) against their twins, and the properties
speculative decoding relies on: rows independent of the batch and of the thread count, on the
host's dot instruction and on the plain-IR one (other CPUs)."""

import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from engine.kernels import qgroup, qlinear
from engine.kernels.qgroup import dequantize_q4_reference
from engine.quant import quantize_q4

rng = np.random.default_rng(11)


@pytest.fixture(
    scope="module", params=[(37, 96), (64, 256), (5, 32)], ids=["ragged", "even", "one-block"]
)
def packed(request):
    o, k = request.param
    qt = quantize_q4(rng.standard_normal((o, k), dtype=np.float32))
    return qt, qgroup.pack_q4_groups(qt.qs, qt.scales)


def test_groups_hold_the_same_weights(packed):
    qt, (p, s) = packed
    o, k = qt.shape
    assert p.shape == (-(-o // 8), k // 32, 128) and s.shape == (p.shape[0], k // 32, 8)
    out = np.empty((o - 3, k), np.float32)
    qgroup.dequantize_q4g_rows(p, s, 3, out)
    assert np.array_equal(out, dequantize_q4_reference(qt.qs, qt.scales)[3:].astype(np.float32))
    with pytest.raises(ValueError):
        qgroup.dequantize_q4g_rows(p, s, 4, np.empty((p.shape[0] * 8 - 3, k), np.float32))


def test_products_match_the_twin_and_do_not_depend_on_batch_or_threads(packed):
    qt, (p, s) = packed
    o, k = qt.shape
    x = rng.standard_normal((9, k), dtype=np.float32)
    x[2] = 0.0  # an all-zero row: zero scales, no division by zero
    ref = qgroup.matmul_q4g_reference(x, qt.qs, qt.scales)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        singles = np.empty((9, o), np.float32)
        for i in range(9):
            qgroup.matmul_q4g(x[i : i + 1], p, s, singles[i : i + 1])
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            for n in range(1, 10):
                out = np.empty((n, o), np.float32)
                qgroup.matmul_q4g(np.ascontiguousarray(x[:n]), p, s, out)
                assert np.array_equal(out, singles[:n]), (threads, n)
    finally:
        numba.set_num_threads(before)
    assert np.abs(singles - ref).max() <= 1e-5 * np.abs(ref).max()
    assert not singles[2].any()


def exact_product(x, qt):
    """x @ w.T in float64 on the dequantized weights (no activation quantization)."""
    return x.astype(np.float64) @ dequantize_q4_reference(qt.qs, qt.scales).T


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9, 16])
def test_error_is_within_the_activation_quantization(n, packed):
    """Off the exact product by at most what int8 activations cost (each x by at most half
    its block's step), and on the twin, which quantizes them the same way."""
    qt, (p, s) = packed
    o, k = qt.shape
    x = rng.standard_normal((n, k), dtype=np.float32)
    out = np.full((n, o), np.nan, np.float32)
    qgroup.matmul_q4g(x, p, s, out)
    ref = qgroup.matmul_q4g_reference(x, qt.qs, qt.scales)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    exact = exact_product(x, qt)
    _, dx = qlinear.quantize_activations_reference(x, np.int8)
    w = np.abs(dequantize_q4_reference(qt.qs, qt.scales)).reshape(o, -1, qlinear.BLOCK)
    bound = (dx.astype(np.float64) / 2) @ w.sum(axis=2).T
    assert (np.abs(out - exact) <= bound * 1.001 + 1e-6 * np.abs(exact).max()).all()


def test_prefill_matches_the_exact_product(packed, monkeypatch):
    qt, (p, s) = packed
    o, k = qt.shape
    monkeypatch.setattr(qlinear, "PREFILL_TILE_FLOATS", 10 * k)  # tiles of <= 10 rows
    x = rng.standard_normal((40, k), dtype=np.float32)
    out = np.full((40, o), np.nan, np.float32)
    qgroup.matmul_q4g_prefill(x, p, s, out)
    exact = exact_product(x, qt)
    assert np.abs(out - exact).max() <= 2e-6 * np.abs(exact).max() * np.sqrt(k)
    scratch = np.empty(qlinear.prefill_tile_rows(o, k) * k, np.float32)
    again = np.empty_like(out)
    qgroup.matmul_q4g_prefill(x, p, s, again, scratch)
    assert np.array_equal(out, again)


def test_offset_sums():
    """The nibbles' +8 taken out per block: 8 x the sum of its 32 activations (int32, no
    overflow at the extremes)."""
    xq = rng.integers(-127, 128, (3, 64)).astype(np.int8)
    xq[0, :32] = -127
    corr = np.empty((3, 2), np.int32)
    qgroup._offset_sums(xq, corr)
    np.testing.assert_array_equal(corr, 8 * xq.astype(np.int32).reshape(3, 2, 32).sum(axis=2))
    assert corr[0, 0] == -8 * 32 * 127


def test_shapes_are_checked(packed):
    qt, (p, s) = packed
    o, k = qt.shape
    with pytest.raises(ValueError):
        qgroup.matmul_q4g(np.ones((1, k + 32), np.float32), p, s, np.empty((1, o), np.float32))
    with pytest.raises(ValueError):
        qgroup.matmul_q4g(np.ones((1, k), np.float32), p, s, np.empty((1, o + 8), np.float32))
    out = np.empty((1, o), np.float32)
    with pytest.raises(numba.TypingError):  # the kernel reads the scales as bf16 bits
        qgroup.matmul_q4g(np.ones((1, k), np.float32), p, s.astype(np.float32), out)


PLAIN_IR_CHECK = """
import numpy as np
from engine.kernels import qgroup
from engine.quant import quantize_q4
assert qgroup.DOT == "generic", qgroup.DOT
rng = np.random.default_rng(5)
qt = quantize_q4(rng.standard_normal((21, 64), dtype=np.float32))
p, s = qgroup.pack_q4_groups(qt.qs, qt.scales)
x = rng.standard_normal((9, 64), dtype=np.float32)
singles = np.empty((9, 21), np.float32)
for i in range(9):
    qgroup.matmul_q4g(x[i : i + 1], p, s, singles[i : i + 1])
for n in range(1, 10):
    out = np.empty((n, 21), np.float32)
    qgroup.matmul_q4g(np.ascontiguousarray(x[:n]), p, s, out)
    assert np.array_equal(out, singles[:n]), n
ref = qgroup.matmul_q4g_reference(x, qt.qs, qt.scales)
assert np.abs(singles - ref).max() <= 1e-5 * np.abs(ref).max()
print("plain IR ok")
"""


def run_plain_ir_check(tmp_path, **env):
    """PLAIN_IR_CHECK in its own process and Numba cache (the switches are read at import)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **env)
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_IR_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "plain IR ok" in done.stdout, done.stderr[-3000:]


def test_generic_dot_code(tmp_path):
    """The plain-IR dot (no vpdpbusd/sdot) built here with MERLIN_QKERNEL=generic: twin
    agreement and rows bitwise equal to 1-row calls for N = 1..9."""
    run_plain_ir_check(tmp_path, MERLIN_QKERNEL="generic")


@pytest.mark.skipif(not qlinear._X86, reason="x86 code path")
def test_x86_without_vnni(tmp_path):
    """What an x86 CPU without VNNI (AVX2 x86-64-v3) runs: the plain-IR dot compiled for it,
    built here by naming that CPU to Numba."""
    run_plain_ir_check(tmp_path, NUMBA_CPU_NAME="x86-64-v3", NUMBA_CPU_FEATURES="")
