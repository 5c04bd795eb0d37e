"""KV cache layout: keys in tiles of 64 written in any chunking, read back, saved and resized."""

import resource

import numpy as np
import pytest

from merlin.engine.kernels.attention import attention
from merlin.engine.kv_cache import KVCache

rng = np.random.default_rng(7)
LAYERS, HEADS, DIM = 2, 3, 16


def rows(n):
    """Random K or V rows for every layer: [layers, n, heads, dim]."""
    return rng.standard_normal((LAYERS, n, HEADS, DIM), dtype=np.float32)


def fill(cache, k, v, chunks):
    """Write tokens 0..sum(chunks)-1 to every layer in pieces of the given sizes."""
    cache.reserve(sum(chunks))
    start = 0
    for size in chunks:
        for layer in range(LAYERS):
            cache.write(
                layer, start, k[layer, start : start + size], v[layer, start : start + size]
            )
        start += size
        cache.length = start


@pytest.mark.parametrize("fmt", ["f32", "q8"])
def test_keys_read_back_in_the_logical_layout_whatever_the_chunks(fmt):
    n = 150  # crosses two tile boundaries
    k, v = rows(n), rows(n)
    whole, pieces = KVCache(LAYERS, HEADS, DIM, 200, fmt), KVCache(LAYERS, HEADS, DIM, 200, fmt)
    fill(whole, k, v, [n])
    fill(pieces, k, v, [1, 62, 1, 1, 85])
    assert np.array_equal(whole.keys(), pieces.keys())
    assert np.array_equal(whole.v, pieces.v) and np.array_equal(whole.k_scale, pieces.k_scale)
    expected = k.transpose(0, 2, 3, 1)  # [layers, heads, dim, n]
    got = whole.keys() * whole.k_scale[:, :, None, :n]
    tol = 0 if fmt == "f32" else whole.k_scale.max() / 2 + 1e-6
    assert got.shape == expected.shape and np.abs(got - expected).max() <= tol


@pytest.mark.parametrize("fmt", ["f32", "q8"])
def test_saved_and_resized_caches_attend_the_same(fmt, tmp_path):
    n = 70
    k, v = rows(n), rows(n)
    cache = KVCache(LAYERS, HEADS, DIM, 100, fmt)
    fill(cache, k, v, [n])
    cache.save(tmp_path / "c.kv")
    loaded, _ = KVCache.load(tmp_path / "c.kv", max_tokens=300)
    grown = KVCache.load(tmp_path / "c.kv", max_tokens=100)[0]
    grown.set_budget(257)
    shrunk = KVCache.load(tmp_path / "c.kv", max_tokens=300)[0]
    shrunk.set_budget(n)
    q = rng.standard_normal((1, 2 * HEADS, DIM), dtype=np.float32)

    def attend(c):
        out = np.empty((1, 2 * HEADS * DIM), np.float32)
        attention(q, *c.layer(1), n - 1, np.float32(DIM**-0.5), out)
        return out

    for other in (loaded, grown, shrunk):
        assert other.length == n and np.array_equal(other.keys(), cache.keys())
        assert np.array_equal(attend(other), attend(cache))


@pytest.mark.parametrize("fmt", ["q8", "f32"])
def test_a_new_cache_is_resident_before_its_first_prefill(fmt):
    """The pages of the whole budget are mapped when the cache is made, so the first
    prompt's prefill does not pay for them (a new chat's time to first token): writing a
    row into every head of every layer of a new cache takes no page fault."""
    cache = KVCache(4, 8, 128, 8192, fmt)
    assert not cache.k.any() and not cache.v.any()
    if fmt == "f32":
        assert (cache.k_scale == 1).all() and (cache.v_scale == 1).all()
    rows = np.ones((1, 8, 128), np.float32)
    KVCache(1, 8, 128, 64, fmt).write(0, 0, rows, rows)  # the kernels compiled and loaded
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for layer in range(4):
        for t in (0, 4000, 8191):
            cache.write(layer, t, rows, rows)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
    assert faults < 16, f"{faults} page faults in the first writes"  # 170+ unmapped
