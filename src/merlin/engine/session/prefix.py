"""Prefix reuse: how many rows of a KV cache equal the start of a new prompt.

A pure function of what the cache holds (token ids, 3D positions, image spans) and the Prompt
the next turn computes. A row is reusable when its id, its position and everything before it
match: an image counts by its content hash (the same pads can stand for another picture), and
an image is never kept in part.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..prompt import ImageSpan, Prompt


def reuse_point(
    tokens: Sequence[int],
    positions: np.ndarray,
    spans: Sequence[ImageSpan],
    prompt: Prompt,
    need_logits: bool = True,
) -> int:
    """Rows of the cache that equal the start of `prompt`: same ids, same 3D positions, same
    images. With need_logits at most N - 1 (the last row is fed again for its logits)."""
    m = min(len(tokens), len(prompt.ids))
    a = np.asarray(tokens[:m], np.int64)
    b = np.asarray(prompt.ids[:m], np.int64)
    diff = np.flatnonzero(a != b)
    lcp = int(diff[0]) if diff.size else m
    bad = np.flatnonzero((positions[:, :lcp] != prompt.positions[:, :lcp]).any(axis=0))
    if bad.size:
        lcp = int(bad[0])
    new = {sp.start: (sp.end, sp.hash) for sp in prompt.spans}
    for sp in spans:
        if sp.start >= lcp:
            break
        if new.get(sp.start) != (sp.end, sp.hash):
            lcp = sp.start
            break
    old = {sp.start for sp in spans}
    for sp in prompt.spans:
        if sp.start < lcp and sp.start not in old:
            lcp = sp.start
            break
    return min(lcp, len(prompt.ids) - 1) if need_logits else lcp
