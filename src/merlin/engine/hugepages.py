"""Arrays carved out of one anonymous mapping backed by 2 MB transparent huge pages.

Decode reads every weight once per token, as a stream per thread. NumPy asks the kernel for
huge pages only for arrays of 4 MB and more, and only for the 2 MB-aligned middle of each, so
a 2B model's layer matrices sat on 4 KB pages for 17-100% of their bytes (the small `o`
projection and every scale array entirely): a TLB miss every 4 KB of the stream, where the
hardware prefetchers also stop. One arena for all of them puts every byte on huge pages
(figures: docs/kernels.md, "Weights on huge pages").

Where the kernel gives no huge pages (THP disabled, another OS) the arena is ordinary memory:
the same arrays, no error. Python's mmap module is the whole implementation: an anonymous
private mapping, madvise(MADV_HUGEPAGE) where the platform has it, NumPy views into it.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 * 1024 * 1024
ALIGN = 64  # each array starts on a cache line


class Arena:
    """Room for `nbytes` of arrays (each rounded up to ALIGN); take() hands out views. The
    mapping lives as long as any view of it."""

    def __init__(self, nbytes: int):
        size = max(HUGE_PAGE, -(-(nbytes + HUGE_PAGE) // HUGE_PAGE) * HUGE_PAGE)
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._bytes = np.frombuffer(self._map, np.uint8)
        # the first 2 MB boundary inside the mapping (mmap gives 4 KB alignment)
        self._offset = -self._bytes.ctypes.data % HUGE_PAGE
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE, self._offset, size - self._offset)
            except OSError:
                pass  # no THP here: ordinary pages
        self._end = size

    def take(self, shape, dtype) -> np.ndarray:
        """A new uninitialised C-contiguous array of this shape and dtype in the arena."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = self._offset
        if start + nbytes > self._end:
            raise MemoryError(f"arena full: {nbytes} bytes asked, {self._end - start} left")
        self._offset = start + -(-nbytes // ALIGN) * ALIGN
        return self._bytes[start : start + nbytes].view(dtype).reshape(shape)

    def copy(self, a: np.ndarray) -> np.ndarray:
        """a's values in a new array of the arena."""
        out = self.take(a.shape, a.dtype)
        out[...] = a
        return out


def arena_bytes(arrays) -> int:
    """Room an Arena needs for copies of these arrays (anything with .nbytes)."""
    return sum(-(-a.nbytes // ALIGN) * ALIGN for a in arrays)
