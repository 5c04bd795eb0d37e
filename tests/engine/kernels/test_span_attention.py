"""The fused int8 attention of the q8 vision encoder (engine/kernels/span_attention.py) against
exact softmax attention in float64: accuracy on shapes that exercise every padding (span
lengths not a multiple of the query tile or key block, head widths not a multiple of the
vector), spans at an offset in a longer sequence, outputs independent of the thread count,
and the softmax's edge cases (one dominant key, equal keys, large scores)."""

import numba
import numpy as np
import pytest

from merlin.engine.kernels import span_attention as span
from merlin.engine.vision.attention import attention, attention_int8


def exact(q, k, v, s0, s1, scale):
    """[s1 - s0, H*HD] float64 softmax(q k^T scale) v over tokens s0..s1 of every head."""
    q, k, v = (a[:, s0:s1].astype(np.float64) for a in (q, k, v))
    s = np.einsum("hid,hjd->hij", q, k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("hij,hjd->hid", p, v)
    return o.transpose(1, 0, 2).reshape(s1 - s0, -1)


def cosine(a, b) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def qkv(rng, heads, n, hd, q_gain=2.0):
    q, k, v = (rng.standard_normal((heads, n, hd), dtype=np.float32) for _ in range(3))
    return q * np.float32(q_gain), k, v


@pytest.mark.parametrize(
    "heads,n,hd",
    [(1, 1, 64), (2, 5, 8), (3, 70, 64), (2, 130, 72), (4, 257, 64), (2, 64, 16), (1, 200, 80)],
)
def test_matches_exact_attention(heads, n, hd):
    rng = np.random.default_rng(n * 31 + hd)
    q, k, v = qkv(rng, heads, n, hd)
    scale = np.float32(hd**-0.5)
    out = np.full((n, heads * hd), np.nan, np.float32)
    attention_int8(q, k, v, [(0, n)], scale, out)
    ref = exact(q, k, v, 0, n, scale)
    assert np.isfinite(out).all()
    assert cosine(out, ref) >= 0.9995
    assert np.abs(out - ref).max() <= 0.15 * np.abs(v).max()


def test_spans_at_an_offset_leave_other_rows_alone():
    """Two images in one sequence: each span attends within itself; rows of no span are not
    written (the kernel's padded query rows are dropped, never stored into a neighbour)."""
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 2, 150, 64)
    spans = [(3, 70), (70, 141)]
    out = np.full((150, 128), 7.0, np.float32)
    attention_int8(q, k, v, spans, np.float32(0.125), out)
    for s0, s1 in spans:
        assert cosine(out[s0:s1], exact(q, k, v, s0, s1, 0.125)) >= 0.9995
    assert (out[:3] == 7.0).all() and (out[141:] == 7.0).all()


def test_close_to_the_f32_form_the_encoder_uses():
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng, 4, 300, 64)
    a = np.empty((300, 256), np.float32)
    b = np.empty_like(a)
    attention(q, k, v, [(0, 300)], np.float32(0.125), a, 2)
    attention_int8(q, k, v, [(0, 300)], np.float32(0.125), b)
    assert cosine(a, b) >= 0.9995


def on_1_and_2_threads(q, k, v, scale) -> list[np.ndarray]:
    """attention_int8 over the whole of q, k, v, once on 1 kernel thread and once on 2
    (class_check.py uses it too)."""
    heads, n, hd = q.shape
    outs = []
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            out = np.empty((n, heads * hd), np.float32)
            attention_int8(q, k, v, [(0, n)], np.float32(scale), out)
            outs.append(out)
    finally:
        numba.set_num_threads(before)
    return outs


def test_outputs_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 3, 1000, 64)
    outs = on_1_and_2_threads(q, k, v, 0.125)
    assert np.array_equal(outs[0], outs[1])


def test_softmax_edge_cases():
    rng = np.random.default_rng(6)
    heads, n, hd = 1, 300, 64
    v = rng.standard_normal((heads, n, hd), dtype=np.float32)
    # one key far above the rest, in the last (partial) key block: the output is its value
    k = rng.standard_normal((heads, n, hd), dtype=np.float32) * np.float32(0.01)
    k[0, 290] = 1.0
    q = np.ones((heads, n, hd), np.float32) * np.float32(4.0)
    out = np.empty((n, hd), np.float32)
    attention_int8(q, k, v, [(0, n)], np.float32(1.0), out)
    assert np.abs(out - v[0, 290]).max() <= 0.01 * np.abs(v[0, 290]).max()
    # equal keys: the mean of the values, over keys in several blocks
    k = np.ones((heads, n, hd), np.float32)
    attention_int8(q, k, v, [(0, n)], np.float32(0.125), out)
    assert np.abs(out - v[0].mean(0)).max() <= 0.01 * np.abs(v).max()
    # large scores (|s| in the hundreds, nearly one-hot rows): no overflow; int8 scores err
    # by about |s| / 127, so the output is close to, not as close as, the moderate cases'
    q, k, v = qkv(rng, 2, 100, 64, q_gain=300.0)
    out = np.empty((100, 128), np.float32)
    attention_int8(q, k, v, [(0, 100)], np.float32(0.125), out)
    assert np.isfinite(out).all() and cosine(out, exact(q, k, v, 0, 100, 0.125)) >= 0.99


def test_packed_shapes_pad_to_the_tiles():
    qp, _, _, kp, _, _, vs = span.new_packed(heads=3, n=70, head_dim=72)
    dp = qp.shape[2]
    assert dp % span.GROUP == 0 and dp >= 72
    assert qp.shape[1] % span.QUERIES == 0 and qp.shape[1] >= 70
    assert kp.shape[1] * span.KEY_BLOCK >= 70 and vs.shape == (3, kp.shape[1], dp)
