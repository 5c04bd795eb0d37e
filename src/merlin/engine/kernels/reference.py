"""Naive NumPy twins of the quantized kernels, for tests: dequantize, float64 products.

The small-N twins quantize the activations as the kernels do (actquant.py), so a kernel and
its twin differ only by float rounding (~1e-6 relative), never by the activation error.
"""

import numpy as np

from .actquant import INV_LEVEL8, INV_LEVEL16
from .irtools import BLOCK


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
