"""The encoder's attention threaded by head (engine/vision/attention.py): the same bits on one
thread or several, two images in one call kept apart, and equal to a plain softmax."""

from __future__ import annotations

import numpy as np

from merlin.engine.vision import attention as attn


def reference(q, k, v, spans, scale):
    nh, n, hd = q.shape
    out = np.zeros((n, nh * hd), np.float64)
    for s0, s1 in spans:
        for h in range(nh):
            s = q[h, s0:s1].astype(np.float64) @ k[h, s0:s1].T.astype(np.float64) * scale
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[s0:s1, h * hd : (h + 1) * hd] = (p / p.sum(axis=1, keepdims=True)) @ v[h, s0:s1]
    return out


def test_threads_give_the_same_bits_and_match_softmax(monkeypatch):
    monkeypatch.setattr(attn, "ATTN_CHUNK_ELEMS", 4096)  # several chunks per head
    rng = np.random.default_rng(3)
    nh, n, hd = 4, 300, 16
    q, k, v = (rng.standard_normal((nh, n, hd), dtype=np.float32) for _ in range(3))
    spans = [(0, 120), (120, 300)]
    scale = np.float32(hd**-0.5)
    one = np.empty((n, nh * hd), np.float32)
    two = np.empty_like(one)
    attn.attention(q, k, v, spans, scale, one, 1)
    attn.attention(q, k, v, spans, scale, two, 2)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, reference(q, k, v, spans, scale), atol=2e-5)
