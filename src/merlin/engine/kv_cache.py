"""KV cache: K (after RoPE) and V rows per layer, appended at positions, truncated for rollback.

Layout: V is [layers, kv_heads, capacity, head_dim]; K is stored in tiles of 64 keys,
[layers, kv_heads, capacity / 64, head_dim, 64] (int8: [..., head_dim / 2, 128], dimensions in
pairs), so attention scores are a vectorised sweep over keys reading one contiguous block per
tile (engine/kernels/attention.py says why).
Saved files hold K in the logical layout [layers, kv_heads, head_dim, tokens].
Formats: f32, or q8 (int8 with one f32 scale per (token, layer, head) row: 132 bytes per
128 values instead of 512). The arrays hold the whole context budget from the start (as
llama.cpp allocates its context up front), so the cache never moves: growing by copying held
the old and the new array together, twice the KV cache at its peak. They are made with
np.zeros; without huge pages the OS would map pages only as rows are written, but NumPy asks
for transparent huge pages on large arrays and the first token writes a row of every head, the
heads 1 MB apart (Qwen3-VL-2B, q8, 8192 tokens), so in practice the budget is resident from the
start (0.49 GB there): the context budget is the knob, and the memory guard counts it.
So the arrays are made resident when they are made (one write a page), not by the first
prompt's prefill: mapping 0.49 GB of fresh pages took 0.09-0.10 s, and 1.1-1.6 s the first time
in a process on a KVM guest, inside the time to first token of a new chat's first question
(docs/vision.md, "Time to first token"). A session makes its cache while the user types.
Small pages instead (madvise NOHUGEPAGE, mapped as rows are written) made that first write
0.03-0.2 s but attention over 4,096 keys 10-25% slower (TLB misses), so huge pages stay.
save/load write the stored rows to a checked file (engine.arrayfile).
"""

from __future__ import annotations

import numpy as np

from . import arrayfile
from .errors import InputError
from .formats import KV_FORMATS
from .kernels.kv_layout import (
    key_tile_shape,
    key_tiles,
    store_keys,
    store_values,
    tile_keys_into,
    untile_keys,
)

PAGE_BYTES = 4096


def _make_resident(a: np.ndarray) -> None:
    """Write a zero into every page of a fresh np.zeros array (whose pages the OS maps only
    when written): they are mapped now rather than at the first prefill."""
    a.reshape(-1).view(np.uint8)[::PAGE_BYTES] = 0


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
        self.length = 0  # tokens stored
        self._allocate(max_tokens)

    def _allocate(self, max_tokens: int) -> None:
        """Arrays for the whole budget (see the module docstring)."""
        shape = (self.n_layers, self.n_kv_heads, max_tokens)
        tiles = key_tile_shape(self.n_kv_heads, max_tokens, self.head_dim, self.dtype)
        self.k = np.zeros((self.n_layers, *tiles), self.dtype)
        self.v = np.zeros((*shape, self.head_dim), self.dtype)
        scales = np.ones if self.fmt == "f32" else np.zeros  # f32: all ones; q8: set per row
        self.k_scale = scales(shape, np.float32)
        self.v_scale = scales(shape, np.float32)
        made_by_zeros = [self.k, self.v] + (
            [self.k_scale, self.v_scale] if scales is np.zeros else []
        )
        for a in made_by_zeros:  # (np.ones wrote its pages already)
            _make_resident(a)

    def set_budget(self, max_tokens: int) -> None:
        """A new context budget (a changed setting): new arrays, the stored rows copied
        over. Rows past the new budget must have been truncated away first."""
        if max_tokens == self.max_tokens:
            return
        if self.length > max_tokens:
            raise ValueError(f"truncate the cache to {max_tokens} tokens before shrinking it")
        n, old = self.length, (self.k, self.v, self.k_scale, self.v_scale)
        self._allocate(max_tokens)
        t = key_tiles(n)
        self.k[:, :, :t] = old[0][:, :, :t]
        self.v[:, :, :n] = old[1][:, :, :n]
        self.k_scale[:, :, :n] = old[2][:, :, :n]
        self.v_scale[:, :, :n] = old[3][:, :, :n]

    @property
    def max_tokens(self) -> int:
        """The context budget: what the arrays hold."""
        return self.v.shape[2]

    capacity = max_tokens

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
        """Check that n_total tokens fit the context budget (the arrays hold it already)."""
        if n_total > self.max_tokens:
            raise InputError(
                f"the conversation needs {n_total} tokens but the context holds "
                f"{self.max_tokens}. Start a new chat or raise the context budget."
            )

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [N, NKV, HD] f32 for cache indexes start..start+N-1 (capacity reserved)."""
        k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
        store_keys(k, self.k[layer], self.k_scale[layer], start)
        store_values(v, self.v[layer], self.v_scale[layer], start)

    def layer(self, layer: int):
        """(k, k_scale, v, v_scale) views of one layer for the attention kernel."""
        return self.k[layer], self.k_scale[layer], self.v[layer], self.v_scale[layer]

    def keys(self) -> np.ndarray:
        """The stored keys in the logical layout [layers, kv_heads, head_dim, length] (a copy;
        for saving and tests)."""
        return untile_keys(self.k, self.length)

    def truncate(self, n: int) -> None:
        """Forget everything from cache index n on (speculative rollback, edit, regenerate)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {n}")
        self.length = n

    # ---- on disk ---------------------------------------------------------------------------

    def describe(self) -> dict:
        """What a saved cache must match to be loaded in place of this one."""
        return {
            "fmt": self.fmt,
            "layers": self.n_layers,
            "kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "length": self.length,
        }

    def array_specs(self, prefix: str = "kv.") -> list[arrayfile.ArraySpec]:
        """The stored rows (not the spare capacity) as arrays to write, one layer at a time."""
        n, nl, nkv, hd = self.length, self.n_layers, self.n_kv_heads, self.head_dim
        specs = [
            arrayfile.ArraySpec(
                prefix + "k",
                self.dtype,
                (nl, nkv, hd, n),
                lambda: (untile_keys(k, n) for k in self.k),
            ),
            arrayfile.ArraySpec(
                prefix + "v", self.dtype, (nl, nkv, n, hd), lambda: (v[:, :n] for v in self.v)
            ),
        ]
        if self.fmt == "q8":
            for name in ("k_scale", "v_scale"):
                arr = getattr(self, name)
                specs.append(
                    arrayfile.ArraySpec(
                        prefix + name,
                        np.float32,
                        (nl, nkv, n),
                        lambda arr=arr: (a[:, :n] for a in arr),
                    )
                )
        return specs

    @classmethod
    def read_from(
        cls,
        reader: arrayfile.Reader,
        desc: dict,
        max_tokens: int,
        prefix: str = "kv.",
        expect: tuple[int, int, int] | None = None,
    ) -> KVCache:
        """A new cache holding the rows stored in `reader` (described by `desc`, from
        describe()). expect: (layers, kv_heads, head_dim) the description must equal (the
        model's; a cache is never sized by the file alone). Raises arrayfile.FileFormatError
        if anything is missing, damaged or out of range."""
        try:
            fmt, n = desc["fmt"], desc["length"]
            nl, nkv, hd = desc["layers"], desc["kv_heads"], desc["head_dim"]
        except (KeyError, TypeError, ValueError):
            raise arrayfile.FileFormatError("it is damaged (no KV cache description)") from None
        if fmt not in KV_FORMATS:
            raise arrayfile.FileFormatError(f"it holds an unknown KV format {fmt!r}")
        from .limits import MAX_CONTEXT_TOKENS, count

        for value, what, hi in (
            (nl, "layers", 1024),
            (nkv, "KV heads", 1024),
            (hd, "head_dim", 1024),
            (n, "length", MAX_CONTEXT_TOKENS),
        ):  # the arrays are sized from these: bounded before anything is allocated
            count(
                value,
                f"its KV cache {what}",
                hi,
                lo=0 if what == "length" else 1,
                error=arrayfile.FileFormatError,
            )
        if expect is not None and (nl, nkv, hd) != tuple(expect):
            raise arrayfile.FileFormatError(
                f"its KV cache is {nl} layers x {nkv} KV heads x {hd}; this model needs "
                f"{expect[0]} x {expect[1]} x {expect[2]}"
            )
        if n > max_tokens:
            raise arrayfile.FileFormatError(
                f"it holds {n} tokens, more than the context budget of {max_tokens}"
            )
        cache = cls(nl, nkv, hd, max_tokens, fmt)
        expected = {"k": (nl, nkv, hd, n), "v": (nl, nkv, n, hd)}
        if fmt == "q8":
            expected |= {"k_scale": (nl, nkv, n), "v_scale": (nl, nkv, n)}
        for name, shape in expected.items():
            if reader.shape(prefix + name) != shape:
                raise arrayfile.FileFormatError(
                    f"it is damaged ({prefix + name} has shape {reader.shape(prefix + name)}, "
                    f"expected {shape})"
                )
        cache.reserve(n)
        for name in expected:
            dest = getattr(cache, name)
            for i, piece in enumerate(reader.iter_leading(prefix + name)):
                if name == "k":
                    tile_keys_into(dest[i], piece)
                else:
                    dest[i][:, :n] = piece
        cache.length = n
        return cache

    def save(self, path, meta: dict | None = None) -> int:
        """Write the stored rows to `path` atomically; returns the file size. Raises
        arrayfile.FileSaveError (disk full, unwritable folder) with the reason."""
        return arrayfile.write(
            path, "merlin-kv", {"kv": self.describe(), **(meta or {})}, self.array_specs()
        )

    @classmethod
    def load(cls, path, max_tokens: int | None = None) -> tuple[KVCache, dict]:
        """(cache, meta) from a file written by save(). Raises arrayfile.FileFormatError with
        the reason when the file is missing, foreign, truncated or damaged."""
        with arrayfile.Reader(path, "merlin-kv") as r:
            desc = r.meta.get("kv") or {}
            n = desc.get("length", 0) if isinstance(desc, dict) else 0
            limit = max_tokens if max_tokens is not None else max(int(n or 0), 1)
            return cls.read_from(r, desc, limit), r.meta
