"""Each Numba kernel against its naive twin, and the property speculative decoding rests on:
a K+1-row forward gives bit-identical rows to K+1 one-row forwards."""

import numba
import numpy as np
import pytest
from support import REFERENCE_DIRS, load_text_model

from merlin.engine.kernels.activation import silu_mul
from merlin.engine.kernels.attention import attention
from merlin.engine.kernels.kv_layout import key_tile_shape, store_keys, store_values, untile_keys
from merlin.engine.kernels.linear import matmul_f32, matmul_f32_reference
from merlin.engine.kernels.norm import rmsnorm, rmsnorm_reference
from merlin.engine.kernels.reference import attention_reference
from merlin.engine.kernels.rope import norm_rope_heads
from merlin.engine.rope import text_positions

rng = np.random.default_rng(0)


@pytest.mark.parametrize("n,k,o", [(1, 64, 40), (5, 96, 17), (16, 256, 33)])
def test_matmul_f32_matches_reference(n, k, o):
    x = rng.standard_normal((n, k), dtype=np.float32)
    w = rng.standard_normal((o, k), dtype=np.float32)
    out = np.empty((n, o), np.float32)
    matmul_f32(x, w, out)
    np.testing.assert_allclose(out, matmul_f32_reference(x, w), rtol=1e-5, atol=1e-4)


def test_matmul_rows_do_not_depend_on_batch_or_threads():
    x = rng.standard_normal((9, 300), dtype=np.float32)
    w = rng.standard_normal((70, 300), dtype=np.float32)
    batch = np.empty((9, 70), np.float32)
    matmul_f32(x, w, batch)
    before = numba.get_num_threads()
    try:
        for threads in {1, before}:
            numba.set_num_threads(threads)
            for i in range(9):
                row = np.empty((1, 70), np.float32)
                matmul_f32(x[i : i + 1], w, row)
                assert np.array_equal(row[0], batch[i])
    finally:
        numba.set_num_threads(before)


def test_rmsnorm_matches_reference():
    x = rng.standard_normal((7, 48), dtype=np.float32) * 3
    w = rng.standard_normal(48).astype(np.float32)
    out = np.empty_like(x)
    rmsnorm(x, w, 1e-6, out)
    np.testing.assert_allclose(out, rmsnorm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_silu_mul():
    gu = rng.standard_normal((3, 20), dtype=np.float32)
    out = np.empty((3, 10), np.float32)
    silu_mul(gu, out)
    g, u = gu[:, :10].astype(np.float64), gu[:, 10:]
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


def rope_reference(x, cos, sin):
    """The half-split rotation in NumPy: dim i pairs with i + HD/2."""
    half = x.shape[-1] // 2
    c = np.concatenate([cos, cos], -1)[:, None]
    s = np.concatenate([sin, sin], -1)[:, None]
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * c + rotated * s


def test_rope_pairs_half_split_dimensions():
    x = rng.standard_normal((2, 3, 8), dtype=np.float32)
    angle = rng.standard_normal((2, 4)).astype(np.float32)
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    y = np.empty_like(x)
    ones = np.ones(8, np.float32)
    norm_rope_heads(x.reshape(2, 24), 0, ones, 1e-6, cos, sin, y)
    normed = rmsnorm_reference(x, ones, 1e-6)
    np.testing.assert_allclose(y, rope_reference(normed, cos, sin), rtol=1e-5, atol=1e-6)


def test_norm_rope_heads_is_norm_then_rope_on_the_fused_rows():
    """The one-pass q/k kernel gives rmsnorm then the rotation of each head's slice of the
    qkv rows (to the last bits of the vectorised sum of squares), each row whatever the
    number of rows (a verify's rows equal decode's), and leaves its input alone."""
    n, heads, hd, col0 = 3, 4, 16, 8
    qkv = rng.standard_normal((n, col0 + heads * hd + 5), dtype=np.float32)
    w = rng.standard_normal(hd, dtype=np.float32)
    angle = rng.standard_normal((n, hd // 2)).astype(np.float32)
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    before = qkv.copy()
    out = np.empty((n, heads, hd), np.float32)
    norm_rope_heads(qkv, col0, w, 1e-6, cos, sin, out)
    heads_rows = qkv[:, col0 : col0 + heads * hd].reshape(n * heads, hd).copy()
    rmsnorm(heads_rows, w, 1e-6, heads_rows)
    expected = rope_reference(heads_rows.reshape(n, heads, hd), cos, sin)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(qkv, before)
    for i in range(n):
        one = np.empty((1, heads, hd), np.float32)
        norm_rope_heads(qkv[i : i + 1], col0, w, 1e-6, cos[i : i + 1], sin[i : i + 1], one)
        assert np.array_equal(one[0], out[i])
    ref = rmsnorm_reference(qkv[:, col0 : col0 + heads * hd].reshape(n, heads, hd), w, 1e-6)
    np.testing.assert_allclose(out, rope_reference(ref, cos, sin), rtol=1e-5, atol=1e-5)


def kv_rows(fmt, cap, nkv, hd):
    """Random K/V rows as the cache stores them: (kf, vf) in f32 [cap, NKV, HD] and the
    kernel's (k in tiles, k_scale, v, v_scale) in `fmt`."""
    kf = rng.standard_normal((cap, nkv, hd), dtype=np.float32)
    vf = rng.standard_normal((cap, nkv, hd), dtype=np.float32)
    dtype = np.float32 if fmt == "f32" else np.int8
    k = np.full(key_tile_shape(nkv, cap, hd, dtype), 99, dtype)  # past cap: never read
    v = np.empty((nkv, cap, hd), dtype)
    ks, vs = np.ones((nkv, cap), np.float32), np.ones((nkv, cap), np.float32)
    store_keys(kf, k, ks, 0)
    store_values(vf, v, vs, 0)
    return (kf, vf), (k, ks, v, vs)


@pytest.mark.parametrize("n,nh,nkv,start", [(1, 4, 2, 0), (1, 8, 2, 37), (5, 4, 4, 10)])
@pytest.mark.parametrize("fmt", ["f32", "q8"])
def test_attention_matches_reference(n, nh, nkv, start, fmt):
    hd, cap = 16, start + n + 3
    q = rng.standard_normal((n, nh, hd), dtype=np.float32)
    (kf, vf), (k, ks, v, vs) = kv_rows(fmt, cap, nkv, hd)
    if fmt == "q8":
        # int8 rows reproduce the f32 rows to half a step of their scale
        v_err = np.abs(v * vs[..., None] - vf.transpose(1, 0, 2)).max()
        k_rows = untile_keys(k, cap).transpose(0, 2, 1)
        k_err = np.abs(k_rows * ks[..., None] - kf.transpose(1, 0, 2)).max()
        assert v_err <= vs.max() / 2 + 1e-6 and k_err <= ks.max() / 2 + 1e-6
    out = np.empty((n, nh * hd), np.float32)
    attention(q, k, ks, v, vs, start, np.float32(hd**-0.5), out)
    ref = attention_reference(q, k, ks, v, vs, start, hd**-0.5)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kv", ["f32", "q8"])
@pytest.mark.parametrize("folder", REFERENCE_DIRS[:2], ids=lambda p: p.name)
def test_verify_rows_bitwise_equal_decode_rows(folder, kv):
    model = load_text_model(folder)
    ids = np.load(folder / "reference.npz")["input_ids"]
    n0, k = len(ids) - 6, 5
    cache = model.new_cache(128, kv)
    model.forward(ids[:n0], text_positions(0, n0), cache, logits="none")
    batch = model.forward(ids[n0 : n0 + k], text_positions(n0, k), cache, logits="all")
    cache.truncate(n0)
    for i in range(k):
        row = model.forward(ids[n0 + i : n0 + i + 1], text_positions(n0 + i, 1), cache)
        assert np.array_equal(row[0], batch[i]), f"row {i} differs"


@pytest.mark.parametrize("fmt", ["f32", "q8"])
@pytest.mark.parametrize("nh,nkv,hd", [(4, 2, 128), (6, 2, 80)])
def test_attention_rows_do_not_depend_on_batch_or_threads(fmt, nh, nkv, hd):
    """Query row n of an N-row call equals a 1-row call at the same position, bit for bit,
    for N = 1..9 across key-tile boundaries (64 keys), group sizes 2 and 3 (every query tile
    shape), a head_dim with a partial value tile, 1 and 2 threads."""
    import numba

    start0, cap = 120, 140
    _, (k, ks, v, vs) = kv_rows(fmt, cap, nkv, hd)
    q = rng.standard_normal((9, nh, hd), dtype=np.float32)
    scale = np.float32(hd**-0.5)
    singles = np.empty((9, nh * hd), np.float32)
    for i in range(9):
        attention(q[i : i + 1], k, ks, v, vs, start0 + i, scale, singles[i : i + 1])
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            for n in range(1, 10):
                out = np.empty((n, nh * hd), np.float32)
                attention(np.ascontiguousarray(q[:n]), k, ks, v, vs, start0, scale, out)
                assert np.array_equal(out, singles[:n]), (threads, n)
    finally:
        numba.set_num_threads(before)
    ref = attention_reference(q, k, ks, v, vs, start0, hd**-0.5)
    np.testing.assert_allclose(singles, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block", [1, 16])
def test_softmax_exp_in_blocks_covers_exactly_the_row(block):
    """The softmax's exp pass in blocks of keys (16 on NEON, one on x86: attention.EXP_BLOCK),
    for every row length across the block edges: sc[:n] = exp(sc[:n] - best) within float32's
    rounding, sc[n:] untouched."""
    from merlin.engine.kernels.attention import _exp_blocks

    x = (rng.standard_normal(70) * 6).astype(np.float32)
    best = np.float32(x.max())
    for n in range(0, 52):
        sc = x.copy()
        _exp_blocks(sc, n, best, block)
        ref = np.exp(x[:n].astype(np.float64) - best)
        np.testing.assert_allclose(sc[:n], ref, rtol=5e-6, atol=0)
        assert np.array_equal(sc[n:], x[n:]), n
