"""KV cache: K (after RoPE) and V rows per layer, appended at positions, truncated for rollback.

Layout [layers, kv_heads, capacity, head_dim] keeps each head's keys contiguous for attention.
Capacity grows in steps so a short chat does not reserve the whole context up front.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError

GROW_STEP = 256


class KVCache:
    def __init__(
        self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int, fmt: str = "f32"
    ):
        if fmt != "f32":
            raise InputError(f"KV cache format {fmt!r} is not supported; use f32.")
        self.fmt = fmt
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.max_tokens = max_tokens
        self.length = 0  # tokens stored
        self.k = np.zeros((n_layers, n_kv_heads, 0, head_dim), np.float32)
        self.v = np.zeros_like(self.k)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 4

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
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.zeros((self.n_layers, self.n_kv_heads, cap, self.head_dim), np.float32)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [N, NKV, HD] for cache indexes start..start+N-1 (capacity reserved before)."""
        n = k.shape[0]
        self.k[layer, :, start : start + n] = k.transpose(1, 0, 2)
        self.v[layer, :, start : start + n] = v.transpose(1, 0, 2)

    def truncate(self, n: int) -> None:
        """Forget everything from cache index n on (speculative rollback, edit, regenerate)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {n}")
        self.length = n
