"""Naive NumPy twins of the quantized kernels and of attention, for tests: dequantize,
float64 products.

The small-N twins quantize the activations as the kernels do (actquant.py), so a kernel and
its twin differ only by float rounding (~1e-6 relative), never by the activation error.
"""

import numpy as np

from .actquant import INV_LEVEL8, INV_LEVEL16
from .irtools import BLOCK
from .kv_layout import untile_keys


def scales_ref(scales):
    """Block scales (uint16 bf16 bits or float32) as float64."""
    s = np.asarray(scales)
    if s.dtype == np.uint16:
        s = (s.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return s.astype(np.float64)


def dequantize_q8_reference(qs, scales):
    """Row-major q8 (engine/quant.py) -> float64 [O, K]."""
    o = qs.shape[0]
    q = qs.astype(np.float64).reshape(o, -1, BLOCK)
    return (q * scales_ref(scales)[:, :, None]).reshape(o, -1)


def dequantize_q4_reference(qs, scales):
    """Row-major q4 (engine/quant.py) -> float64 [O, K]."""
    o = qs.shape[0]
    b = qs.reshape(o, -1, BLOCK // 2)
    u = np.concatenate([b & 15, b >> 4], axis=2).astype(np.float64) - 8.0
    return (u * scales_ref(scales)[:, :, None]).reshape(o, -1)


def quantize_activations_reference(x, dtype):
    """Twin of actquant.quantize_activations to `dtype` (int16 or int8): (xq int32, dx)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    level = INV_LEVEL16 if np.dtype(dtype).itemsize == 2 else INV_LEVEL8
    d = np.abs(blocks).max(axis=2) * level
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    xq = np.rint(blocks * inv[:, :, None]).astype(np.int32).reshape(x.shape)
    return xq, d.astype(np.float32)


def small_n_reference(dequantize, x_dtype, x, qs, scales):
    """x (quantized to x_dtype as the kernels do) @ dequantize(qs, scales).T in float64."""
    xq, dx = quantize_activations_reference(x, x_dtype)
    xd = (xq.reshape(len(xq), -1, BLOCK) * dx[:, :, None].astype(np.float64)).reshape(xq.shape)
    return (xd @ dequantize(qs, scales).T).astype(np.float32)


def matmul_q8_reference(x, qs, scales):
    """Twin of qlinear.matmul_q8_prefill: dequantize, float64 product (x unquantized)."""
    return (x.astype(np.float64) @ dequantize_q8_reference(qs, scales).T).astype(np.float32)


def matmul_q8_small_reference(x, qs, scales):
    """Twin of qlinear.matmul_q8 and qgroup.matmul_q8g: int16 activations."""
    return small_n_reference(dequantize_q8_reference, np.int16, x, qs, scales)


def matmul_q4g_reference(x, qs, scales):
    """Twin of qgroup.matmul_q4g on the row-major q4 it was packed from: int8 activations."""
    return small_n_reference(dequantize_q4_reference, np.int8, x, qs, scales)


def matmul_q8a8g_reference(x, qs, scales):
    """Twin of qgroup.matmul_q8a8g on the row-major q8 it was packed from: int8 activations."""
    return small_n_reference(dequantize_q8_reference, np.int8, x, qs, scales)


matmul_q8g_reference = matmul_q8_small_reference


def attention_reference(q, k_tiles, k_scale, v, v_scale, start, scale):
    """Naive float64 twin of attention() (with its int16 queries and weights for an int8
    cache)."""
    n_rows, n_heads, head_dim = q.shape
    group = n_heads // k_tiles.shape[0]
    k_t = untile_keys(k_tiles, v.shape[1])
    kf = k_t.transpose(0, 2, 1).astype(np.float64) * k_scale[..., None]
    if k_tiles.dtype == np.int8:  # the kernel's int16 queries
        step = np.abs(q).max(axis=2, keepdims=True) * INV_LEVEL16
        inv = np.divide(np.float32(1.0), step, out=np.zeros_like(step), where=step != 0)
        q = np.rint(q * inv).astype(np.float64) * step
    vf = v.astype(np.float64) * v_scale[..., None]
    out = np.zeros((n_rows, n_heads * head_dim))
    for n in range(n_rows):
        for h in range(n_heads):
            keys = kf[h // group, : start + n + 1]
            s = keys @ q[n, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            if v.dtype == np.int8:  # the kernel's int16 weights: softmax x the row scale
                w = p * v_scale[h // group, : start + n + 1]
                step = w.max() / 32767
                w = np.rint(w / step) * step if step > 0 else w
                rows = v[h // group, : start + n + 1].astype(np.float64)
                out[n, h * head_dim : (h + 1) * head_dim] = w @ rows
            else:
                out[n, h * head_dim : (h + 1) * head_dim] = p @ vf[h // group, : start + n + 1]
    return out.astype(np.float32)
