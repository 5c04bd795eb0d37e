"""q8 vision weights: the encoder's block and merger matrices through the grouped integer
kernels (engine/kernels/qgroup.py, q8a8: q8_0 weights, activations quantized to int8 per
block of 32 inside the kernel, one 4-byte integer dot for 4 products a lane where an f32 fma
does 1), the path text prefill of q4 models' q8 head takes (engine/linear.GroupLinear). A
matrix whose input width is not a multiple of 32 stays f32 (runs_q8).

Each matrix is widened from the checkpoint (StoredWeight.f32), quantized to q8_0
(engine/quant.quantize_q8: absmax / 127 per block of 32, bf16 scales) and packed at the first
q8 encode, then kept on the StoredWeight (`.q8`): about 1.06 bytes a weight, 0.43 GB for the
2B encoder, instead of widening 0.8 GB of bf16 to f32 at every encode. The quality against
f32 (cosine of embeddings and DeepStack features >= 0.999, greedy answers unchanged) is
measured in tests/engine/vision/test_vision_q8.py and docs/vision.md.

The kernel wants C-contiguous f32 activations and an output of exactly [N, O] rows; apply()
copies a strided input (none of the encoder's are) rather than fail.
"""

from __future__ import annotations

import threading

import numpy as np

from ..linear import GroupLinear
from ..linear import quantizable as linear_quantizable
from ..quant import quantize_q8

_LOCK = threading.Lock()  # two threads encoding at once quantize a matrix once


def runs_q8(weight) -> bool:
    """Can this StoredWeight run as q8 (its input width a multiple of the 32-wide blocks)?
    The others stay f32 BLAS in a q8 encoder: Qwen3-VL-8B's fc2 reads 4,304 columns."""
    return linear_quantizable(weight.shape[1])


def quantizable(stored) -> bool:
    """Can any of these StoredWeights run as q8 (a q8 encoder is worth having)?"""
    return any(runs_q8(w) for w in stored)


def q8_linear(weight, scratch: dict) -> GroupLinear:
    """The StoredWeight as a q8a8 GroupLinear, quantized on first use and kept."""
    lin = getattr(weight, "q8", None)
    if lin is not None:
        return lin
    with _LOCK:
        lin = getattr(weight, "q8", None)
        if lin is None:
            w = weight.f32(scratch, "quantize")
            lin = GroupLinear.from_qtensor(quantize_q8(w), "q8a8")
            weight.q8 = lin
    return lin


def apply(lin: GroupLinear, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x @ W.T with W in q8 (lin), x: [N, K] f32; out: [N, O] f32 (allocated if None)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty((x.shape[0], lin.out_features), np.float32)
    if out.flags.c_contiguous:
        lin(x, out)
    else:
        tmp = np.empty(out.shape, np.float32)
        lin(x, tmp)
        out[...] = tmp
    return out


def quantized_bytes(stored) -> int:
    """Bytes the q8 matrices hold once made (0 before the first q8 encode)."""
    return sum(w.q8.nbytes for w in stored if getattr(w, "q8", None) is not None)
