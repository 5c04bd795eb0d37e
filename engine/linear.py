"""Weight containers for matrix products. The model code calls `lin(x, out)` (and `rows(ids)`
for an embedding lookup) and never knows the storage format: f32, q8_0 or q4_0.

Small N (decode N = 1, speculative verify N = K + 1) runs the Numba kernels that read each
weight once for all rows with a per-row summation order independent of N; large N (prefill)
goes through NumPy's BLAS (f32) or dequantized tiles through BLAS (q8/q4).
"""

from __future__ import annotations

import numpy as np

from .formats import WEIGHT_FORMATS  # noqa: F401 (re-exported)
from .kernels.linear import matmul_f32
from .kernels.qlinear import (
    dequantize_q4_rows,
    dequantize_q8_rows,
    matmul_q4,
    matmul_q4_prefill,
    matmul_q8,
    matmul_q8_prefill,
)
from .quant import BLOCK, QTensor

# Up to this many rows the Numba kernel runs (decode, verify: same code, bitwise equal rows).
SMALL_N = 16


class F32Linear:
    fmt = "f32"

    def __init__(self, w: np.ndarray):
        self.w = np.ascontiguousarray(w, dtype=np.float32)  # [O, K]

    @property
    def out_features(self) -> int:
        return self.w.shape[0]

    @property
    def in_features(self) -> int:
        return self.w.shape[1]

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        """x: [N, K] f32 C-contiguous -> out: [N, O] f32."""
        if x.shape[0] <= SMALL_N:
            matmul_f32(x, self.w, out)
        else:
            np.matmul(x, self.w.T, out=out)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup: [len(ids), K] f32 (a copy)."""
        return self.w[ids]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"w": self.w}


class QLinear:
    """q8_0 / q4_0 weights (see engine/quant.py for the layout)."""

    _kernels = {
        "q8": (matmul_q8, matmul_q8_prefill, dequantize_q8_rows),
        "q4": (matmul_q4, matmul_q4_prefill, dequantize_q4_rows),
    }

    def __init__(self, qt: QTensor):
        self.qt = qt
        self.fmt = qt.fmt
        self._small, self._large, self._dequant = self._kernels[qt.fmt]

    @property
    def out_features(self) -> int:
        return self.qt.out_features

    @property
    def in_features(self) -> int:
        return self.qt.in_features

    @property
    def nbytes(self) -> int:
        return self.qt.nbytes

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        if x.shape[0] <= SMALL_N:
            self._small(x, self.qt.qs, self.qt.scales, out)
        else:
            self._large(x, self.qt.qs, self.qt.scales, out)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((len(ids), self.in_features), np.float32)
        for i, t in enumerate(np.asarray(ids)):
            self._dequant(self.qt.qs[t : t + 1], self.qt.scales[t : t + 1], 0, out[i : i + 1])
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        return {"qs": self.qt.qs, "scales": self.qt.scales}


def linear_from_arrays(fmt: str, arrays: dict[str, np.ndarray]):
    """Rebuild a container from arrays() output (the quantized-weight disk cache)."""
    if fmt == "f32":
        return F32Linear(arrays["w"])
    return QLinear(QTensor(fmt, arrays["qs"], arrays["scales"]))


def quantizable(k: int) -> bool:
    return k % BLOCK == 0
