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


def mrope_positions(
    ids,
    image_token_id: int,
    grids,
    merge_size: int = 2,
    start: int = 0,
    delta: int = 0,
) -> tuple[np.ndarray, int]:
    """3D positions of a prompt with images, as transformers' get_rope_index makes them.

    ids: the prompt with every image's pads expanded (t*h*w/merge**2 each, images in order);
    grids: (t, h, w) per image in patches; start: cache index of ids[0]; delta: the rope delta
    in force before it (0 for a fresh conversation). Text tokens get (p, p, p) and advance p by
    one; image k's tokens, in row-major order over its merged grid (t, r, c), get
    (p + t, p + r, p + c), after which p advances by max(h, w) / merge (not by the token
    count). Returns (positions [3, N] int64, rope delta): a token at cache index i after the
    prompt sits at position i + delta on all three axes.
    """
    ids = np.asarray(ids)
    n = len(ids)
    pos = np.empty((3, n), np.int64)
    cur = start + delta
    i = k = 0
    while i < n:
        if ids[i] != image_token_id:
            j = i
            while j < n and ids[j] != image_token_id:
                j += 1
            pos[:, i:j] = np.arange(cur, cur + j - i)
            cur += j - i
            i = j
            continue
        if k >= len(grids):
            raise ValueError(f"image token at {i} but only {len(grids)} image grid(s) given")
        t, h, w = (int(v) for v in grids[k])
        gh, gw = h // merge_size, w // merge_size
        count = t * gh * gw
        if i + count > n or not np.all(ids[i : i + count] == image_token_id):
            raise ValueError(f"image {k} needs {count} consecutive image tokens at {i}")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        pos[0, i : i + count] = cur + tt.ravel()
        pos[1, i : i + count] = cur + hh.ravel()
        pos[2, i : i + count] = cur + ww.ravel()
        cur += max(gh, gw)
        i += count
        k += 1
    if k != len(grids):
        raise ValueError(f"{len(grids)} image grid(s) given but the prompt holds {k} image(s)")
    new_delta = int(pos.max()) + 1 - (start + n) if n else delta
    return pos, new_delta
