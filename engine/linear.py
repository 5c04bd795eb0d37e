"""Weight containers for matrix products. The model code calls `lin(x, out)` and never knows
the storage format; quantized formats (q8_0, q4_0) plug in here as other containers.
"""

from __future__ import annotations

import numpy as np

from .kernels.linear import matmul_f32

# Up to this many rows the Numba kernel runs (decode, speculative verify: same code, bitwise
# equal rows); above it NumPy's BLAS does prefill.
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


def make_linear(w: np.ndarray, fmt: str = "f32"):
    if fmt == "f32":
        return F32Linear(w)
    raise ValueError(f"unknown weight format {fmt!r}")
