"""The KV cache's memory layout: how keys and values are stored for the attention kernel.

A score tile reads, for each of the head_dim dimensions, 64 consecutive keys. With
K transposed as one [head_dim, capacity] matrix those were 128 streams at a stride of the
capacity, more than the prefetchers follow. Tiled, a score tile reads one contiguous 8 KB
(int8) block and a head's keys are one sequential stream: f32 [kv_head, capacity / 64,
head_dim, 64]; int8 [kv_head, capacity / 64, head_dim / 2, 128], the two dimensions of a pair
side by side for each key. V stays [kv_head, capacity, head_dim]; the value tiles interleave
two keys' rows in registers. Saved caches keep the logical [head_dim, tokens] layout
(untile_keys / tile_keys_into).

Storing quantizes an int8 cache per (token, KV head) row with a symmetric scale max|x| / 127
(scales[head, token]); an f32 cache stores the values and keeps all-ones scales.
"""

import numpy as np
from numba import njit

from . import FASTMATH

KEY_BLOCK = 64  # keys per stored K tile
KEY_PAIRS = 2  # int8 K tiles hold each key's dimensions in pairs (below)


def key_tiles(capacity: int) -> int:
    """Stored K tiles for a capacity of that many tokens."""
    return -(-capacity // KEY_BLOCK)


def key_tile_shape(n_kv: int, capacity: int, head_dim: int, dtype) -> tuple:
    """The K array of one layer: f32 [NKV, tiles, HD, 64]; int8 [NKV, tiles, HD / 2, 128],
    byte 2u + c of row p holding dimension 2p + c of key u (the pairs one vpdpwssd lane sums)."""
    if np.dtype(dtype) == np.int8:
        if head_dim % KEY_PAIRS:
            raise ValueError(f"an int8 KV cache needs an even head_dim, not {head_dim}")
        return (n_kv, key_tiles(capacity), head_dim // KEY_PAIRS, KEY_PAIRS * KEY_BLOCK)
    return (n_kv, key_tiles(capacity), head_dim, KEY_BLOCK)


def _logical_tiles(k_tiles: np.ndarray) -> np.ndarray:
    """[..., tiles, HD, 64] (a view for f32, a copy for int8 pair tiles)."""
    if k_tiles.dtype != np.int8:
        return k_tiles
    *lead, pairs, row = k_tiles.shape
    split = k_tiles.reshape(*lead, pairs, KEY_BLOCK, KEY_PAIRS)
    return np.swapaxes(split, -1, -2).reshape(*lead, pairs * KEY_PAIRS, KEY_BLOCK)


def untile_keys(k_tiles: np.ndarray, n: int) -> np.ndarray:
    """Keys 0..n-1 of the stored tiles (key_tile_shape) in the logical layout [..., HD, n]
    (a copy)."""
    t = key_tiles(n)
    flat = np.swapaxes(_logical_tiles(k_tiles[..., :t, :, :]), -3, -2)  # [..., HD, t, 64]
    return flat.reshape(*flat.shape[:-2], t * KEY_BLOCK)[..., :n]


def tile_keys_into(k_tiles: np.ndarray, keys: np.ndarray) -> None:
    """Store logical keys [..., HD, n] as keys 0..n-1 of the tiles (key_tile_shape); the rest
    of the last tile is zeroed."""
    n = keys.shape[-1]
    t = key_tiles(n)
    padded = np.zeros((*keys.shape[:-1], t * KEY_BLOCK), keys.dtype)
    padded[..., :n] = keys
    tiles = np.swapaxes(padded.reshape(*keys.shape[:-1], t, KEY_BLOCK), -3, -2)  # [.., t, HD, 64]
    if k_tiles.dtype == np.int8:
        *lead, hd, _ = tiles.shape
        split = tiles.reshape(*lead, hd // KEY_PAIRS, KEY_PAIRS, KEY_BLOCK)
        tiles = np.swapaxes(split, -1, -2).reshape(*lead, hd // KEY_PAIRS, KEY_PAIRS * KEY_BLOCK)
    k_tiles[..., :t, :, :] = tiles


@njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _row_factor(x, n, g, scales, pos, quantized):
    """What row (n, g) of x is multiplied by before it is stored: 1 for an f32 cache; for an
    int8 one, 1 / its symmetric scale max|x| / 127, which goes to scales[g, pos]."""
    if not quantized:
        return np.float32(1.0)
    amax = np.float32(0.0)
    for d in range(x.shape[2]):
        amax = max(amax, abs(x[n, g, d]))
    sc = amax / np.float32(127.0)
    scales[g, pos] = sc
    return np.float32(0.0) if sc == 0 else np.float32(1.0) / sc


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def store_keys(x, k_tiles, scales, start):
    """x: [N, NKV, HD] f32 -> keys start..start+N-1 of every head, in the tiles of
    key_tile_shape. An int8 cache gets one symmetric scale per (token, head) row in
    scales[g, t]; an f32 one gets the values (its scales stay ones)."""
    quantized = k_tiles.itemsize == 1
    for n in range(x.shape[0]):
        t = start + n
        tile, u = t // KEY_BLOCK, t % KEY_BLOCK
        for g in range(x.shape[1]):
            f = _row_factor(x, n, g, scales, t, quantized)
            for d in range(x.shape[2]):
                value = x[n, g, d] * f
                if quantized:
                    p, c = d // KEY_PAIRS, d % KEY_PAIRS
                    k_tiles[g, tile, p, KEY_PAIRS * u + c] = np.rint(value)
                else:
                    k_tiles[g, tile, d, u] = value


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def store_values(x, v, scales, start):
    """x: [N, NKV, HD] f32 -> rows start..start+N-1 of v [NKV, capacity, HD], scales as
    store_keys."""
    quantized = v.itemsize == 1
    for n in range(x.shape[0]):
        t = start + n
        for g in range(x.shape[1]):
            f = _row_factor(x, n, g, scales, t, quantized)
            for d in range(x.shape[2]):
                value = x[n, g, d] * f
                v[g, t, d] = np.rint(value) if quantized else value
