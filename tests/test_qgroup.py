"""Grouped q4 kernels (engine/kernels/qgroup.py) against their twins, and the properties
speculative decoding relies on: rows independent of the batch and of the thread count."""

import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from engine.kernels import qgroup
from engine.kernels.qlinear import dequantize_q4_reference
from engine.quant import quantize_q4

rng = np.random.default_rng(11)


@pytest.fixture(scope="module", params=[(37, 96), (64, 256)], ids=["ragged", "even"])
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


GENERIC = """
import numpy as np
from engine.kernels import qgroup
from engine.quant import quantize_q4
assert qgroup.DOT == "generic"
rng = np.random.default_rng(5)
qt = quantize_q4(rng.standard_normal((21, 64), dtype=np.float32))
p, s = qgroup.pack_q4_groups(qt.qs, qt.scales)
x = rng.standard_normal((6, 64), dtype=np.float32)
out = np.empty((6, 21), np.float32)
qgroup.matmul_q4g(x, p, s, out)
one = np.empty((1, 21), np.float32)
qgroup.matmul_q4g(x[4:5].copy(), p, s, one)
assert np.array_equal(one[0], out[4])
ref = qgroup.matmul_q4g_reference(x, qt.qs, qt.scales)
assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
print("generic ok")
"""


def test_generic_dot_code(tmp_path):
    """The plain-IR dot (no vpdpbusd/sdot) built here with MERLIN_QKERNEL=generic, in its own
    process and Numba cache (the switch is read at import)."""
    env = dict(os.environ, MERLIN_QKERNEL="generic", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", GENERIC], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "generic ok" in done.stdout, done.stderr[-3000:]
