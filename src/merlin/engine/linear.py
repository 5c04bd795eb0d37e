"""Weight containers for matrix products. The model code calls `lin(x, out)` (and `rows(ids)`
for an embedding lookup) and never knows the storage format: f32, q8_0 or q4_0.

Small N (decode N = 1, speculative verify N = K + 1) runs the Numba kernels that read each
weight once for all rows with a per-row summation order independent of N. Large N (prefill):
f32 through NumPy's BLAS; grouped q4/q8 (GroupLinear) through the same integer dot-product
kernels as decode, whose int8 / int16 dots outrun dequantizing to f32 for BLAS at every N
(Zen 4, 2B shapes, 2 threads: 2-10x at N = 17-64, 1.1-2x at N = 512; docs/benchmarks.md),
so a quantized model's rows are the same bits however a prompt is cut into forwards; but
q8 in 8-row groups (the 256-bit x86 classes, qgroup.Q8_DOTS_PREFILL false) and row-major q8
(QLinear, aarch64) through dequantized tiles and BLAS.
"""

from __future__ import annotations

import numpy as np

from .formats import WEIGHT_FORMATS  # noqa: F401 (re-exported)
from .kernels.linear import matmul_f32
from .kernels.qgroup import (
    GROUP,
    Q8_DOTS_PREFILL,
    Q8_GROUPED,
    dequantize_q4g_rows,
    dequantize_q8a8g_rows,
    dequantize_q8g_rows,
    matmul_q4g,
    matmul_q8a8g,
    matmul_q8g,
    pack_q4_groups,
    pack_q8_groups,
    pack_q8a8_groups,
)
from .kernels.qlinear import (
    dequantize_q8_rows,
    matmul_q8,
    matmul_q8_prefill,
    prefill_product,
)
from .quant import BLOCK, QTensor

# Up to this many rows F32Linear and QLinear run their Numba kernel (decode, verify: same
# code, bitwise equal rows), beyond it BLAS. GroupLinear runs its kernel at any N.
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
    """q8_0 weights, row-major (engine/quant.py), where the grouped q8 kernel is not the
    model's (qgroup.Q8_GROUPED: aarch64, the generic class)."""

    fmt = "q8"

    def __init__(self, qt: QTensor):
        if qt.fmt != "q8":
            raise ValueError("QLinear holds q8 weights (q4 runs grouped: GroupLinear)")
        self.qt = qt

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
            matmul_q8(x, self.qt.qs, self.qt.scales, out)
        else:
            matmul_q8_prefill(x, self.qt.qs, self.qt.scales, out)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((len(ids), self.in_features), np.float32)
        for i, t in enumerate(np.asarray(ids)):
            dequantize_q8_rows(self.qt.qs[t : t + 1], self.qt.scales[t : t + 1], 0, out[i : i + 1])
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        return {"qs": self.qt.qs, "scales": self.qt.scales}


class GroupLinear:
    """q4_0 or q8_0 weights in groups of GROUP output rows (engine/kernels/qgroup.py: one
    integer dot-product instruction serves all rows of a group). kind: "q4" (int8
    activations), "q8" (int16 activations), "q8a8" (q8_0 weights, int8 activations)."""

    _kernels = {
        "q4": (pack_q4_groups, matmul_q4g, dequantize_q4g_rows),
        "q8": (pack_q8_groups, matmul_q8g, dequantize_q8g_rows),
        "q8a8": (pack_q8a8_groups, matmul_q8a8g, dequantize_q8a8g_rows),
    }
    KINDS = tuple(_kernels)

    def __init__(self, kind: str, packed: np.ndarray, gscales: np.ndarray, out_features: int):
        self.kind = kind
        self.fmt = "q8" if kind == "q8a8" else kind  # the weights' format (their bytes)
        self.packed, self.gscales = packed, gscales
        self.out_features = int(out_features)
        _, self._matmul, self._dequant = self._kernels[kind]

    @classmethod
    def from_qtensor(cls, qt: QTensor, kind: str | None = None) -> GroupLinear:
        kind = kind or qt.fmt
        pack = cls._kernels[kind][0]
        return cls(kind, *pack(qt.qs, qt.scales), qt.out_features)

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.gscales.nbytes

    @property
    def dequantizes_for_prefill(self) -> bool:
        """Does a product of more than SMALL_N rows go through BLAS on dequantized weights
        (q8 where its int16 dots trail sgemm: qgroup.Q8_DOTS_PREFILL)?"""
        return self.kind == "q8" and not Q8_DOTS_PREFILL

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        if x.shape[0] > SMALL_N and self.dequantizes_for_prefill:
            prefill_product(self._dequant, x, self.packed, self.gscales, out, None)
        else:
            self._matmul(x, self.packed, self.gscales, out)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((len(ids), self.in_features), np.float32)
        for i, t in enumerate(np.asarray(ids)):
            self._dequant(self.packed, self.gscales, int(t), out[i : i + 1])
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        rows = np.array([self.out_features], np.int64)
        return {"packed": self.packed, "gscales": self.gscales, "rows": rows}


def quantized_linear(qt: QTensor, int8_activations: bool = False):
    """The container the kernels run fastest on: grouped q4 always, grouped q8 where
    qgroup.Q8_GROUPED, else row-major q8; q8 weights with int8_activations grouped always
    (the q4 path's dot)."""
    if qt.fmt == "q8" and int8_activations:
        return GroupLinear.from_qtensor(qt, "q8a8")
    if qt.fmt == "q4" or Q8_GROUPED:
        return GroupLinear.from_qtensor(qt)
    return QLinear(qt)


def prefill_dequantizes(lin) -> bool:
    """Does a forward of more than SMALL_N rows pay a fixed cost of dequantizing all of
    `lin` to f32 for BLAS? (Row-major q8, and grouped q8 in 8-row groups: a short prompt is
    then cheaper as forwards of SMALL_N rows.)"""
    return isinstance(lin, QLinear) or (
        isinstance(lin, GroupLinear) and lin.dequantizes_for_prefill
    )


def linear_kind(lin) -> str:
    """What the weight cache records to rebuild `lin`: its format, or a grouped kind."""
    return lin.kind if isinstance(lin, GroupLinear) else lin.fmt


def linear_from_arrays(kind: str, arrays: dict[str, np.ndarray]):
    """Rebuild a container from arrays() output (the quantized-weight disk cache)."""
    if kind == "f32":
        return F32Linear(arrays["w"])
    if "packed" in arrays:
        rows = arrays["rows"]
        if rows.shape != (1,) or not 0 < int(rows[0]) <= GROUP * arrays["packed"].shape[0]:
            raise ValueError("the grouped matrix's row count is damaged")
        return GroupLinear(kind, arrays["packed"], arrays["gscales"], int(rows[0]))
    return QLinear(QTensor(kind, arrays["qs"], arrays["scales"]))


def quantizable(k: int) -> bool:
    return k % BLOCK == 0
