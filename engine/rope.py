"""3D MRoPE: position triples (t, h, w) for mixed image/text prompts and their cos/sin tables.

Qwen3-VL interleaves the axes over the frequency slots: slot j uses H when j % 3 == 1 and
j < 3 * section[1], W when j % 3 == 2 and j < 3 * section[2], T otherwise. cos/sin are built
in float32 the way transformers builds them, so positions far into the context still match.
"""

from __future__ import annotations

import numpy as np

from .config import TextConfig
from .kernels.rope import rope_tables


class MRope:
    def __init__(self, cfg: TextConfig):
        half = cfg.head_dim // 2
        exps = np.arange(0, cfg.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(
            cfg.head_dim
        )
        self.inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** exps)).astype(np.float32)
        axis = np.zeros(half, np.int64)  # 0 = T, 1 = H, 2 = W
        sec = cfg.mrope_section
        axis[1 : 3 * sec[1] : 3] = 1
        axis[2 : 3 * sec[2] : 3] = 2
        self.axis = axis  # [HD/2]

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """positions: [3, N] int -> (cos, sin) each [N, HD/2] float32."""
        n = positions.shape[1]
        cos = np.empty((n, len(self.axis)), np.float32)
        sin = np.empty_like(cos)
        rope_tables(
            np.ascontiguousarray(positions, dtype=np.int64), self.axis, self.inv_freq, cos, sin
        )
        return cos, sin


def text_positions(start: int, n: int, delta: int = 0) -> np.ndarray:
    """Positions of n text tokens at cache indexes start..start+n-1: [3, n] int64."""
    p = np.arange(start + delta, start + delta + n, dtype=np.int64)
    return np.stack([p, p, p])
