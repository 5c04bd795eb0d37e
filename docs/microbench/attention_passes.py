"""What the int8-KV attention spends per query and key outside its integer products: the
softmax row (scale, max, exp, sum, normalise: kernels/attention.py _softmax_row) and the
quantization of its weights to int16 (_quantize_weights), each in a compiled loop of 2000
calls on one thread, its data in cache; cycles at the clock given. Session 32 measured these
when the board model counted only the products (~8.6 cycles a query and key against ~12.6
measured); since session 33 `bench board` models each pass (attention.ROW_PASSES) and this
script is the hand check of those figures (docs/benchmarks.md, "Issue 20 at a glance").

    python docs/microbench/attention_passes.py [GHz]
"""

import sys
import time

import numba
import numpy as np
from numba import njit

from merlin.engine.kernels.attention import _quantize_weights, _softmax_row

GHZ = float(sys.argv[1]) if len(sys.argv) > 1 else 3.49  # session 32's clock (bench board)
numba.set_num_threads(1)


@njit(nogil=True)
def softmax_rows(sc, n, k_scale, v_scale, scale, reps):
    for _ in range(reps):
        _softmax_row(sc, n, k_scale, v_scale, scale)


@njit(nogil=True)
def quantize_rows(scores, n, wq, wsc, reps):
    for _ in range(reps):
        _quantize_weights(scores, n, wq, wsc)


def best_seconds(fn, *args, repeats=7, calls=2000):
    fn(*args, 1)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args, calls)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


rng = np.random.default_rng(0)
for n in (1024, 3072):
    sc = rng.standard_normal(n).astype(np.float32)
    scales = np.full(n, 0.01, np.float32)
    soft = best_seconds(softmax_rows, sc, n, scales, scales, np.float32(0.1))
    scores = np.abs(rng.standard_normal((2, n))).astype(np.float32)
    wq, wsc = np.empty((2, n + n % 2), np.int16), np.empty(2, np.float32)
    quant = best_seconds(quantize_rows, scores, n, wq, wsc)
    print(
        f"{n} keys: softmax {soft * GHZ * 1e9 / n:.2f} cycles a key, weights to int16 "
        f"{quant * GHZ * 1e9 / (2 * n):.2f} cycles a query and key"
    )
