"""Numba kernels of the vision encoder: the element-wise work between the matrix products.

The big matrix products (patch embed, qkv, proj, MLP, mergers, attention scores and values) go
to NumPy's BLAS in the f32 encoder (the q8 one: the grouped integer kernels and the fused int8
attention, engine/vision/encoder.py), using every core; these kernels do what NumPy would need
several passes over memory for, once per block. They are deliberately single-threaded: a
parallel (OpenMP) Numba region between BLAS calls leaves libgomp's worker threads spinning on
the cores the next BLAS call needs. Measured on the 2-core machine, 448x448 through the 2B
encoder: 5.2-6.2 s with parallel kernels, 3.8-4.2 s with one thread (the element-wise part
itself is memory-bound and gained little from a second thread); a tight loop alternating the
two was ~9x slower. (The q8 encoder has no BLAS call between its blocks' products and runs
these kernels on row chunks over its threads: VisionEncoder._by_rows.)

`_exp` is a vectorisable exp (range reduction to 2^k * 2^f, a degree-6 polynomial for 2^f and
2^k built from its exponent bits; no table, so no index a NaN could move). Numba's own exp
is a scalar libm call that stops LLVM from vectorising the loop (tanh-GELU was ~4x slower
with it). Relative error below 2e-7 for arguments in [-87, 87];
below that it returns tiny positive numbers instead of 0, harmless in the logistic of
tanh-GELU.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..kernels import FASTMATH
from ..kernels.mathfn import _pow2

POW2 = np.ldexp(np.float32(1.0), np.arange(-126, 128)).astype(np.float32)  # 2^k, k = -126..127
_LOG2E = np.float32(1.4426950408889634)


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _exp(x, pow2):
    """exp(x); NaN in gives NaN out. 2^k is built from its exponent bits (mathfn._pow2), not
    read from a table: a NaN or infinite argument (NaN weights, overflowing activations)
    must never become an index, since Numba checks no bounds. `pow2` is kept for the
    callers' signature and unused."""
    t = x * _LOG2E
    t = min(max(t, np.float32(-125.0)), np.float32(125.0))
    n = np.floor(t + np.float32(0.5))
    f = t - n  # in [-0.5, 0.5]
    p = np.float32(1.5403530393381606e-4)
    p = p * f + np.float32(1.3333558146428443e-3)
    p = p * f + np.float32(9.618129107628477e-3)
    p = p * f + np.float32(5.550410866482158e-2)
    p = p * f + np.float32(2.402265069591007e-1)
    p = p * f + np.float32(6.931471805599453e-1)
    p = p * f + np.float32(1.0)
    y = p * _pow2(n)
    return y if x == x else x


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def layernorm(x, w, b, eps, out):
    """out = (x - mean) / sqrt(var + eps) * w + b over the last axis. x, out: [R, D] f32."""
    n_rows, dim = x.shape
    for r in range(n_rows):
        s = 0.0
        for d in range(dim):
            s += x[r, d]
        mean = s / dim
        ss = 0.0
        for d in range(dim):
            c = x[r, d] - mean
            ss += c * c
        inv = 1.0 / math.sqrt(ss / dim + eps)
        m32 = np.float32(mean)
        i32 = np.float32(inv)
        for d in range(dim):
            out[r, d] = (x[r, d] - m32) * i32 * w[d] + b[d]


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def add_bias(x, b):
    """x[r, :] += b, in place. x: [R, D] f32."""
    n_rows, dim = x.shape
    for r in range(n_rows):
        for d in range(dim):
            x[r, d] += b[d]


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def add_bias_residual(x, y, b):
    """x += y + b, in place. x, y: [R, D] f32."""
    n_rows, dim = x.shape
    for r in range(n_rows):
        for d in range(dim):
            x[r, d] += y[r, d] + b[d]


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def split_heads_rope(qkv, b, cos, sin, q, k, v, s0, s1):
    """Rows s0..s1 of: qkv: [S, 3*H*HD] (x @ Wqkv.T, bias not yet added), b: [3*H*HD];
    cos/sin: [S, HD/2]; q, k, v: [H, S, HD] outputs. Adds the bias, splits the heads and
    rotates q and k (half-split pairs i, i + HD/2, as rotate_half in transformers). A row
    range, not views of the rows: q[:, s0:s1] would not be contiguous."""
    n_heads, seq, head_dim = q.shape
    half = head_dim // 2
    width = n_heads * head_dim
    for s in range(max(0, s0), min(seq, s1)):
        for h in range(n_heads):
            # slices indexed from range(): an index such as width + base + i, which Numba
            # cannot prove non-negative, gets a wraparound branch per access (scalar loops)
            q0, k0, v0 = h * head_dim, width + h * head_dim, 2 * width + h * head_dim
            qx, qb = qkv[s, q0 : q0 + head_dim], b[q0 : q0 + head_dim]
            kx, kb = qkv[s, k0 : k0 + head_dim], b[k0 : k0 + head_dim]
            vx, vb = qkv[s, v0 : v0 + head_dim], b[v0 : v0 + head_dim]
            qo, ko, vo = q[h, s], k[h, s], v[h, s]
            for i in range(half):
                c = cos[s, i]
                sn = sin[s, i]
                a = qx[i] + qb[i]
                z = qx[half + i] + qb[half + i]
                qo[i] = a * c - z * sn
                qo[half + i] = z * c + a * sn
                a = kx[i] + kb[i]
                z = kx[half + i] + kb[half + i]
                ko[i] = a * c - z * sn
                ko[half + i] = z * c + a * sn
            for i in range(head_dim):
                vo[i] = vx[i] + vb[i]


@njit(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def bias_gelu_tanh(x, b, pow2):
    """In place x = gelu_tanh(x + b) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))),
    computed as z / (1 + exp(-2 sqrt(2/pi) (z + 0.044715 z^3))), the same function.
    error_model="numpy" as in kernels/activation.silu_mul: the default's zero-divisor check
    kept the loop scalar (5.3 ns a value against 0.7, 784 x 4096 values); 1 + exp(..) > 0."""
    n_rows, dim = x.shape
    for r in range(n_rows):
        for d in range(dim):
            z = x[r, d] + b[d]
            u = np.float32(-1.5957691216057308) * (z + np.float32(0.044715) * z * z * z)
            x[r, d] = z / (np.float32(1.0) + _exp(u, pow2))


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def bias_gelu_erf(x, b):
    """In place x = gelu(x + b) with the exact erf form (torch.nn.GELU())."""
    n_rows, dim = x.shape
    for r in range(n_rows):
        for d in range(dim):
            z = x[r, d] + b[d]
            e = math.erf(z * np.float32(0.7071067811865476))
            x[r, d] = np.float32(0.5) * z * (np.float32(1.0) + e)
