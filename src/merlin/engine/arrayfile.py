"""A versioned file of named arrays plus JSON metadata: written atomically, checked on read.

Used for saved chat sessions (engine.session) and KV caches (KVCache.save/load). Layout,
little-endian:

    0      8  magic b"MERLINAF"
    8      4  u32 container version
    12     4  u32 0 (reserved)
    16    ..  array data, each array starting on a 64-byte boundary
    H     ..  header: UTF-8 JSON {"kind", "meta", "arrays": [{name, dtype, shape, offset,
              nbytes, crc32}]}
    end-32    trailer: u64 H, u64 header length, u32 header CRC32, u32 container version,
              8 bytes b"MERLINEN"

The header comes after the data so that arrays stream out once, their CRC32s computed on the
way; a file cut short has no valid trailer. Reading checks magic, version, sizes, the header's
CRC and each array's CRC, and raises FileFormatError with a readable reason for any problem.
Writing goes to a temporary file in the same folder, is flushed to disk, then renamed over
the target, so a crash or a full disk never leaves a half-written file under the real name
(through a symlink to its target, with the replaced file's permissions: replace_file.py).
"""

from __future__ import annotations

import errno
import json
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import replace_file
from .errors import MerlinError

MAGIC = b"MERLINAF"
END_MAGIC = b"MERLINEN"
CONTAINER_VERSION = 1
ALIGN = 64
_HEAD = struct.Struct("<8sII")  # magic, version, reserved
_TRAIL = struct.Struct("<QQII8s")  # header offset, header length, header crc, version, magic
MAX_HEADER = 256 * 1024 * 1024


class FileFormatError(MerlinError):
    """The file is not a usable Merlin array file (foreign, truncated, corrupt, other version)."""


class FileSaveError(MerlinError):
    """Writing failed (disk full, read-only folder...); the previous file, if any, is intact."""


@dataclass
class ArraySpec:
    """One array to write. chunks() yields C-ordered pieces whose concatenation (flattened) is
    the array, so a large array can be written piece by piece without a full copy."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: Callable[[], Iterable[np.ndarray]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def array_spec(name: str, a: np.ndarray) -> ArraySpec:
    a = np.asarray(a)
    return ArraySpec(name, a.dtype, tuple(a.shape), lambda: [a])


def _pad(n: int) -> int:
    return -n % ALIGN


def estimate_size(meta: dict, arrays: list[ArraySpec]) -> int:
    """Bytes the file will take (the header's size estimated from the metadata)."""
    data = sum(a.nbytes + ALIGN for a in arrays)
    return _HEAD.size + data + len(json.dumps(meta)) + 200 * len(arrays) + _TRAIL.size


def _describe_os_error(e: OSError, path: Path) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full (no space left to write {path.name} in {path.parent})"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{path.parent} cannot be written ({e.strerror})"
    return f"{path}: {e.strerror or e}"


def write(path: Path | str, kind: str, meta: dict, arrays: list[ArraySpec]) -> int:
    """Write the file atomically; returns its size. Raises FileSaveError (with a reason a
    person can act on) when the disk is full or the folder cannot be written. A symlink stays
    a link (its target is replaced) and the replaced file's permissions are kept."""
    path = replace_file.target(path)
    tmp = replace_file.temporary_name(path)
    entries = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file.create_temporary(tmp, path)
        with open(tmp, "wb") as f:
            f.write(_HEAD.pack(MAGIC, CONTAINER_VERSION, 0))
            offset = _HEAD.size
            for spec in arrays:
                pad = _pad(offset)
                f.write(b"\0" * pad)
                offset += pad
                crc, written = 0, 0
                for chunk in spec.chunks():
                    chunk = np.ascontiguousarray(chunk, dtype=spec.dtype)
                    if chunk.nbytes == 0:  # e.g. an empty cache (a 0 in the shape)
                        continue
                    view = memoryview(chunk).cast("B")
                    crc = zlib.crc32(view, crc)
                    f.write(view)
                    written += view.nbytes
                if written != spec.nbytes:
                    raise ValueError(
                        f"array {spec.name}: wrote {written} bytes, its shape needs {spec.nbytes}"
                    )
                entries.append(
                    {
                        "name": spec.name,
                        "dtype": np.dtype(spec.dtype).str,
                        "shape": list(spec.shape),
                        "offset": offset,
                        "nbytes": written,
                        "crc32": crc,
                    }
                )
                offset += written
            # ASCII JSON: any text (even a lone surrogate from odd input) round-trips
            header = json.dumps({"kind": kind, "meta": meta, "arrays": entries}).encode()
            f.write(header)
            f.write(
                _TRAIL.pack(offset, len(header), zlib.crc32(header), CONTAINER_VERSION, END_MAGIC)
            )
            f.flush()
            os.fsync(f.fileno())
            size = offset + len(header) + _TRAIL.size
        replace_file.keep_permissions(tmp, path)
        os.replace(tmp, path)
    except OSError as e:
        _unlink_quietly(tmp)
        raise FileSaveError(_describe_os_error(e, path)) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return size


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


class Reader:
    """Open and check a file's structure and header; arrays are read (and checked) on demand.

    Raises FileFormatError for a missing, foreign, truncated, corrupt or newer file."""

    def __init__(self, path: Path | str, kind: str):
        self.path = Path(path)
        from .safe_open import open_regular

        if not os.path.lexists(self.path):
            raise FileFormatError(f"{self.path} does not exist")
        # never blocks on a FIFO or device: those are refused with what they are
        self._f = open_regular(self.path, "the saved file", FileFormatError)
        try:
            self._open(kind)
        except BaseException:
            self._f.close()
            raise

    def _open(self, kind: str) -> None:
        f = self._f
        size = os.fstat(f.fileno()).st_size
        self.size = size
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size or head[:8] != MAGIC:
            raise FileFormatError("it is not a Merlin file (wrong magic bytes)")
        _, version, _ = _HEAD.unpack(head)
        if version > CONTAINER_VERSION:
            raise FileFormatError(
                f"it was written by a newer Merlin (file format {version}, this one reads "
                f"{CONTAINER_VERSION})"
            )
        if size < _HEAD.size + _TRAIL.size:
            raise FileFormatError("it is truncated (shorter than its header)")
        f.seek(size - _TRAIL.size)
        h_off, h_len, h_crc, t_version, end = _TRAIL.unpack(f.read(_TRAIL.size))
        if end != END_MAGIC or t_version != version:
            raise FileFormatError("it is truncated or damaged (no valid end marker)")
        if h_off + h_len + _TRAIL.size != size or h_len > MAX_HEADER or h_off < _HEAD.size:
            raise FileFormatError("it is truncated or damaged (sizes do not add up)")
        f.seek(h_off)
        raw = f.read(h_len)
        if zlib.crc32(raw) != h_crc:
            raise FileFormatError("it is damaged (header checksum mismatch)")
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise FileFormatError("it is damaged (header is not valid JSON)") from None
        if not isinstance(header, dict) or header.get("kind") != kind:
            got = header.get("kind") if isinstance(header, dict) else None
            raise FileFormatError(f"it holds {got!r}, not {kind!r}")
        self.meta = header.get("meta")
        if not isinstance(self.meta, dict):
            raise FileFormatError("it is damaged (no metadata)")
        self.entries: dict[str, dict] = {}
        try:
            for e in header["arrays"]:
                dtype = np.dtype(e["dtype"])
                shape = tuple(int(s) for s in e["shape"])
                n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if (
                    n != e["nbytes"]
                    or min(shape, default=0) < 0
                    or dtype.hasobject
                    or e["offset"] < _HEAD.size
                    or e["offset"] + n > h_off
                ):
                    raise ValueError(e.get("name"))
                self.entries[e["name"]] = dict(e, dtype=dtype, shape=shape)
        except (KeyError, TypeError, ValueError) as e:
            raise FileFormatError(f"it is damaged (bad array entry {e})") from None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def _entry(self, name: str) -> dict:
        if name not in self.entries:
            raise FileFormatError(f"it is incomplete (array {name!r} is missing)")
        return self.entries[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name)["shape"]

    def read(self, name: str) -> np.ndarray:
        """The whole array (checked against its CRC32)."""
        e = self._entry(name)
        out = np.empty(e["shape"], e["dtype"])
        self._f.seek(e["offset"])
        view = memoryview(out).cast("B") if out.nbytes else memoryview(b"")
        if out.nbytes and self._f.readinto(view) != out.nbytes:
            raise FileFormatError(f"it is truncated (array {name!r})")
        if zlib.crc32(view) != e["crc32"]:
            raise FileFormatError(f"it is damaged (checksum mismatch in {name!r})")
        return out

    def iter_leading(self, name: str) -> Iterator[np.ndarray]:
        """The array one index of its first axis at a time (a reused buffer: copy what you
        keep). The CRC is checked after the last piece: a consumer must not commit what it
        read until the iterator is exhausted without raising."""
        e = self._entry(name)
        shape = e["shape"]
        if not shape:
            raise FileFormatError(f"it is damaged ({name!r} has no axes)")
        buf = np.empty(shape[1:], e["dtype"])
        view = memoryview(buf).cast("B") if buf.nbytes else memoryview(b"")
        crc = 0
        self._f.seek(e["offset"])
        for _ in range(shape[0]):
            if buf.nbytes and self._f.readinto(view) != buf.nbytes:
                raise FileFormatError(f"it is truncated (array {name!r})")
            crc = zlib.crc32(view, crc)
            yield buf
        if crc != e["crc32"]:
            raise FileFormatError(f"it is damaged (checksum mismatch in {name!r})")
