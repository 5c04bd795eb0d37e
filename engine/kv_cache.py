"""KV cache: K (after RoPE) and V rows per layer, appended at positions, truncated for rollback.

Layout: V is [layers, kv_heads, capacity, head_dim]; K is stored transposed,
[layers, kv_heads, head_dim, capacity], so attention scores are a vectorised sweep over keys.
Formats: f32, or q8 (int8 with one f32 scale per (token, layer, head) row: 132 bytes per
128 values instead of 512). Capacity grows in steps so a short chat does not reserve the whole
context up front.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError
from .kernels.attention import quantize_rows_q8

GROW_STEP = 256
KV_FORMATS = ("f32", "q8")


class KVCache:
    def __init__(
        self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int, fmt: str = "f32"
    ):
        if fmt not in KV_FORMATS:
            raise InputError(
                f"unknown KV cache format {fmt!r}; choose one of {', '.join(KV_FORMATS)}."
            )
        self.fmt = fmt
        self.dtype = np.float32 if fmt == "f32" else np.int8
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.max_tokens = max_tokens
        self.length = 0  # tokens stored
        shape = (n_layers, n_kv_heads, 0)
        self.k = np.zeros((n_layers, n_kv_heads, head_dim, 0), self.dtype)  # transposed
        self.v = np.zeros((*shape, head_dim), self.dtype)
        self.k_scale = np.ones(shape, np.float32)  # all ones for f32
        self.v_scale = np.ones(shape, np.float32)

    @property
    def capacity(self) -> int:
        return self.v.shape[2]

    @property
    def nbytes(self) -> int:
        return (
            self.k.nbytes
            + self.v.nbytes
            + (self.k_scale.nbytes + self.v_scale.nbytes if self.fmt == "q8" else 0)
        )

    def bytes_per_token(self) -> int:
        """Bytes one cached token occupies (and attention reads per step)."""
        per_row = self.head_dim * (4 if self.fmt == "f32" else 1) + (4 if self.fmt == "q8" else 0)
        return 2 * self.n_layers * self.n_kv_heads * per_row

    def reserve(self, n_total: int) -> None:
        """Make room for n_total tokens (never above max_tokens)."""
        if n_total > self.max_tokens:
            raise InputError(
                f"the conversation needs {n_total} tokens but the context holds "
                f"{self.max_tokens}. Start a new chat or raise the context budget."
            )
        if n_total <= self.capacity:
            return
        cap = min(self.max_tokens, max(n_total, 2 * self.capacity, GROW_STEP))
        cap = min(self.max_tokens, -(-cap // GROW_STEP) * GROW_STEP)
        keep = self.length
        k = np.zeros((self.n_layers, self.n_kv_heads, self.head_dim, cap), self.dtype)
        k[..., :keep] = self.k[..., :keep]
        self.k = k
        for name in ("v", "k_scale", "v_scale"):
            old = getattr(self, name)
            new = (np.zeros if name == "v" else np.ones)(
                (self.n_layers, self.n_kv_heads, cap, *old.shape[3:]), old.dtype
            )
            new[:, :, :keep] = old[:, :, :keep]
            setattr(self, name, new)

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [N, NKV, HD] f32 for cache indexes start..start+N-1 (capacity reserved)."""
        n = k.shape[0]
        if self.fmt == "f32":
            self.k[layer, :, :, start : start + n] = k.transpose(1, 2, 0)
            self.v[layer, :, start : start + n] = v.transpose(1, 0, 2)
        else:
            k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
            quantize_rows_q8(k, self.k[layer], self.k_scale[layer], start, True)
            quantize_rows_q8(v, self.v[layer], self.v_scale[layer], start, False)

    def layer(self, layer: int):
        """(k, k_scale, v, v_scale) views of one layer for the attention kernel."""
        return self.k[layer], self.k_scale[layer], self.v[layer], self.v_scale[layer]

    def truncate(self, n: int) -> None:
        """Forget everything from cache index n on (speculative rollback, edit, regenerate)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {n}")
        self.length = n
