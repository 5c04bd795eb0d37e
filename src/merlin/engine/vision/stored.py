"""Vision matrices left in the checkpoint file, read with pread() when an image is encoded.

The block and merger matrices of the vision encoder (0.8 GB of BF16 for Qwen3-VL-2B) are not
held in memory: a chat without images never needs them. They used to stay memory-mapped, but
a mapped file that is truncated or rewritten while the app runs (a download resumed, a copy
over the folder) makes the next read of a lost page raise SIGBUS, which kills the process.
Reading with pread() instead turns the same event into a short read, or a size or mtime that
changed since the load (checked before every read), and so into a CheckpointError that says
to reload the model. The extra cost is one copy from the page cache per encode into a raw
scratch buffer of one block (the widening to float32 was one pass over the data already).

Layout: a WeightFile per safetensors file (one open descriptor, its identity at load); a
StoredWeight per matrix: (file, byte offset, shape, stored dtype).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..checkpoint import DTYPES, to_f32
from ..errors import CheckpointError
from ..safe_open import open_regular


class WeightFile:
    """A checkpoint file kept open for pread(), with its size and mtime at load."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = open_regular(self.path, "the weights file", CheckpointError)
        st = os.fstat(self._f.fileno())
        self._identity = (st.st_size, st.st_mtime_ns)

    def _changed(self, detail: str) -> CheckpointError:
        return CheckpointError(
            f"{self.path} changed on disk while Merlin was running ({detail}); the image "
            "cannot be encoded from it. Reload the model (or restart Merlin) once the file is "
            "complete again."
        )

    def read_into(self, offset: int, buf: np.ndarray) -> None:
        """Fill `buf` (C-contiguous) with the bytes at `offset`; CheckpointError when the file
        is shorter or was modified since the load."""
        fd = self._f.fileno()
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != self._identity:
            raise self._changed(f"its size is {st.st_size:,} bytes, was {self._identity[0]:,}")
        view = memoryview(buf).cast("B")
        done = 0
        while done < view.nbytes:
            try:
                n = os.preadv(fd, [view[done:]], offset + done)
            except OSError as e:
                raise self._changed(e.strerror or str(e)) from None
            if n <= 0:
                raise self._changed("it is shorter than when it was loaded")
            done += n


class StoredWeight:
    """A weight matrix left in the checkpoint file, in its stored dtype (BF16, F16 or F32).
    It becomes float32 (exactly: the widening is lossless) only while an image is encoded,
    one block at a time into reused scratch; an idle model holds none of it."""

    def __init__(self, file: WeightFile, offset: int, shape: tuple[int, ...], dtype: str):
        self.file = file
        self.offset = offset
        self.shape = tuple(shape)
        self.dtype = dtype
        self.q8 = None  # engine/vision/qweights.py: the quantized matrix, once made

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * DTYPES[self.dtype][1]

    def f32(self, scratch: dict[str, np.ndarray], role: str) -> np.ndarray:
        """The matrix as float32 in scratch[role] (allocated on first use; BF16/F16 are read
        into scratch[role + '.raw'] and widened)."""
        buf = scratch.get(role)
        if buf is None or buf.shape != self.shape:
            buf = scratch[role] = np.empty(self.shape, np.float32)
        if self.dtype == "F32":
            self.file.read_into(self.offset, buf)
            return buf
        key = role + ".raw"
        raw = scratch.get(key)
        np_dtype = DTYPES[self.dtype][0]
        if raw is None or raw.shape != self.shape or raw.dtype != np_dtype:
            raw = scratch[key] = np.empty(self.shape, np_dtype)
        self.file.read_into(self.offset, raw)
        return to_f32(raw, self.dtype, out=buf)

    def release(self) -> None:
        """Nothing to drop: no pages of the file are mapped (kept for the encoder's callers)."""
