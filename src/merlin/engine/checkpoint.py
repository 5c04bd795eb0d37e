"""Safetensors reader (and a small writer) written for this format.

Why not the `safetensors` package: Merlin must bound-check every header field before it slices
anything and turn every malformed file into a CheckpointError with a message, and it converts
BF16/F16 to f32 one tensor at a time straight from an mmap so that peak memory stays near one
copy of the weights. The format is small (8-byte length, JSON header, raw little-endian data).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CheckpointError
from .finite import check_tensor
from .safe_open import open_regular

# The safetensors package allows 100 MB. Real headers are far smaller (Qwen3-VL-8B: ~110 kB
# over 4 shards), and Python's JSON parser can build ~25 bytes of objects per header byte
# (`[{},{},...]`), so a smaller cap bounds what a hostile header can make the parser allocate
# (~200 MB at most, tests/robustness/test_fuzz_safetensors.py).
MAX_HEADER_BYTES = 8 * 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# dtype name -> (numpy dtype of the stored bytes, bytes per element)
DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "F64": (np.dtype("<f8"), 8),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
# safetensors dtypes of checkpoints quantized by other tools (FP8, MXFP4...) or of other uses:
# a valid file Merlin does not read, not a damaged one
UNREAD_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "U16", "U32", "U64",
                 "C64")  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset in the file, after the header
    end: int
    file: Path

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _reject_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _dangling(path: Path) -> bool:
    """A symbolic link whose target does not exist (not a loop: open says what that is)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return os.path.islink(path)
    except OSError:
        return False
    return False


class SafetensorsFile:
    """One .safetensors file: header parsed and validated at open, data mapped lazily.
    remedy: what a damaged file's error tells the person to do (a cache file: that it is
    rebuilt)."""

    def __init__(self, path: Path, remedy: str = "download it again"):
        self.path, self._remedy = Path(path), remedy

        try:
            if not os.path.lexists(self.path):
                raise CheckpointError(f"{self.path}: file is missing; {remedy}.")
            if _dangling(self.path):  # a link whose file is gone (a hub cache's blob)
                raise CheckpointError(
                    f"{self.path}: a link to {os.readlink(self.path)!r}, which is gone; {remedy}."
                )
            # a FIFO, device or folder is refused with what it is, never opened blocking
            self._fd = open_regular(self.path, "the weights file", CheckpointError)
        except (UnicodeError, ValueError) as e:  # a name no file system can hold
            raise CheckpointError(f"{self.path!r}: not a usable file name ({e}).") from None
        try:
            self.tensors, self.metadata = self._read_header()
            self._map = None
            if self._data_size:
                self._map = mmap.mmap(self._fd.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            self._fd.close()
            raise

    def _fail(self, problem: str) -> CheckpointError:
        return CheckpointError(
            f"{self.path}: {problem}. The file is damaged or not a safetensors file; "
            f"{self._remedy}."
        )

    def _read_header(self):
        size = os.fstat(self._fd.fileno()).st_size
        if size < 8:
            raise self._fail(f"file is {size} bytes, too short for a safetensors header")
        n = int.from_bytes(self._fd.read(8), "little")
        if n > MAX_HEADER_BYTES:
            raise self._fail(f"header length {n} is larger than the {MAX_HEADER_BYTES} byte limit")
        if 8 + n > size:
            raise self._fail(f"header length {n} is larger than the file ({size} bytes)")
        raw = self._fd.read(n)
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
        except (UnicodeDecodeError, ValueError) as e:
            raise self._fail(f"header is not valid JSON ({e})") from None
        except RecursionError:  # `[[[[...` nested deeper than the parser's stack
            raise self._fail("header is not valid JSON (nested too deeply)") from None
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")
        self._data_start = 8 + n
        self._data_size = size - self._data_start
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise self._fail("__metadata__ is not an object")
        tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            tensors[name] = self._check_entry(name, entry)
        spans = sorted((t.begin, t.end, t.name) for t in tensors.values() if t.end > t.begin)
        for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
            if begin_b < end_a:
                raise self._fail(f"tensors {a!r} and {b!r} overlap")
        return tensors, metadata

    def _check_entry(self, name: str, entry) -> TensorInfo:
        if not isinstance(entry, dict):
            raise self._fail(f"entry for {name!r} is not an object")
        dtype = entry.get("dtype")
        if dtype in UNREAD_DTYPES:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} is stored as {dtype}, which Merlin does not read "
                f"(it reads {', '.join(FLOAT_DTYPES)} weights): a checkpoint quantized by "
                "another tool. Use the model's BF16 release; Merlin quantizes it itself "
                "(--weights q8 or q4)."
            )
        if dtype not in DTYPES:
            raise self._fail(f"tensor {name!r} has unknown dtype {dtype!r}")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise self._fail(f"tensor {name!r} has an invalid shape {shape!r}")
        offsets = entry.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise self._fail(f"tensor {name!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= self._data_size:
            raise self._fail(
                f"tensor {name!r} data_offsets [{begin}, {end}] lie outside the "
                f"{self._data_size} data bytes (truncated file?)"
            )
        count = nonzero = 1
        for s in shape:
            count *= s  # Python ints: no overflow
            nonzero *= s or 1
        if nonzero * DTYPES[dtype][1] > 2**62:  # even with a 0 in it, NumPy cannot make it
            raise self._fail(f"tensor {name!r} has an impossible shape {shape}")
        if count * DTYPES[dtype][1] != end - begin:
            raise self._fail(
                f"tensor {name!r}: shape {shape} x {dtype} needs {count * DTYPES[dtype][1]} "
                f"bytes but data_offsets span {end - begin}"
            )
        return TensorInfo(name, dtype, tuple(shape), begin, end, self.path)

    def raw(self, name: str) -> np.ndarray:
        """The stored values as a read-only view of the mapped file (no copy)."""
        info = self.tensors[name]
        np_dtype, _ = DTYPES[info.dtype]
        if info.nbytes == 0:
            return np.zeros(info.shape, np_dtype)
        start = self._data_start + info.begin
        arr = np.frombuffer(
            self._map, dtype=np_dtype, count=info.nbytes // np_dtype.itemsize, offset=start
        )
        return arr.reshape(info.shape)

    def release(self, name: str) -> None:
        """Drop the tensor's file pages from this process's memory once it has been converted
        (they stay in the OS page cache), so loading never holds the file and the converted
        weights at once."""
        self.releaser(name)()

    def releaser(self, name: str) -> Callable[[], None]:
        """release(name) as a callable that stays valid after close() while views of the
        tensor are alive (the map itself lives on with them)."""
        info = self.tensors[name]
        mapped = self._map
        if mapped is None or info.nbytes == 0 or not hasattr(mmap, "MADV_DONTNEED"):
            return lambda: None
        page = mmap.PAGESIZE
        start = (self._data_start + info.begin) // page * page
        length = self._data_start + info.end - start

        def release() -> None:
            try:
                mapped.madvise(mmap.MADV_DONTNEED, start, length)
            except (OSError, ValueError):
                pass  # only a memory hint; a closed map holds no pages

        return release

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a view is still alive; the OS releases the map with the last reference
            self._map = None
        self._fd.close()


def to_f32(raw: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Stored values -> float32 (exactly, for BF16/F16), into `out` (C-contiguous, raw's
    shape) or a new array; never a view of the file."""
    if dtype not in FLOAT_DTYPES:
        raise CheckpointError(f"a {dtype} tensor cannot be used as a float weight")
    if out is None:
        out = np.empty(raw.shape, np.float32)
    if dtype == "BF16":
        np.left_shift(raw, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        out[...] = raw
    return out


_SHARD = re.compile(r"^(.*)-(\d+)-of-(\d+)\.safetensors$")


def _reject_repeated_names(index: Path) -> None:
    """A weight_map that lists a tensor twice (JSON keeps only the last one, silently)."""
    try:
        json.loads(index.read_text(encoding="utf-8"), object_pairs_hook=_reject_duplicates)
    except ValueError as e:
        raise CheckpointError(
            f"{index}: {e} in the index (JSON would keep only the last). Download {INDEX_NAME} "
            "again."
        ) from None


def _reject_unnamed_shards(index: Path, named: set[str]) -> None:
    """A shard of the same series (prefix-0000k-of-0000n.safetensors) that the index never
    names: its tensors would be ignored, so the index does not belong to these files."""
    series = {(m.group(1), m.group(3)) for f in named if (m := _SHARD.match(f))}
    for path in sorted(index.parent.glob("*.safetensors")):
        m = _SHARD.match(path.name)
        if m and (m.group(1), m.group(3)) in series and path.name not in named:
            raise CheckpointError(
                f"{index}: the shard {path.name} is in the folder but the index names none of "
                f"its tensors. The index does not match the shards; download {INDEX_NAME} again."
            )


class Checkpoint:
    """All safetensors files of one checkpoint folder, single-file or sharded."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        index = self.folder / INDEX_NAME
        self.files: dict[Path, SafetensorsFile] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            if os.path.lexists(index):
                self._open_sharded(index)
            elif os.path.lexists(self.folder / SINGLE_NAME):
                self._open_file(self.folder / SINGLE_NAME)
            else:
                found = sorted(p.name for p in self.folder.glob("*.safetensors"))
                if len(found) != 1:
                    raise CheckpointError(
                        f"{self.folder}: no {SINGLE_NAME} or {INDEX_NAME} found. Choose the "
                        "folder of a Hugging Face checkpoint with its .safetensors weights."
                    )
                self._open_file(self.folder / found[0])
        except BaseException:
            self.close()
            raise

    def _open_file(self, path: Path) -> SafetensorsFile:
        if path not in self.files:
            f = SafetensorsFile(path)
            self.files[path] = f
            for name, info in f.tensors.items():
                if name in self.tensors:
                    raise CheckpointError(f"{path}: tensor {name!r} is also in another shard.")
                self.tensors[name] = info
        return self.files[path]

    def _open_sharded(self, index: Path) -> None:
        from .config import read_json

        data = read_json(index, INDEX_NAME)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: 'weight_map' is missing or empty.")
        _reject_repeated_names(index)
        for name, file in weight_map.items():
            if (
                not isinstance(file, str)
                or not file
                or any(c in file for c in "/\\\0")
                or file.startswith(".")
            ):
                raise CheckpointError(f"{index}: shard name {file!r} for {name!r} is not valid.")
        named = set(weight_map.values())
        missing = sorted(f for f in named if not os.path.lexists(self.folder / f))
        if missing:  # an interrupted download: say which, and that the index lists them
            raise CheckpointError(
                f"{self.folder}: {INDEX_NAME} lists {len(missing)} weights file(s) that are "
                f"not there ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}). "
                "The download is incomplete: download the checkpoint again."
            )
        for file in sorted(named):
            self._open_file(self.folder / file)
        _reject_unnamed_shards(index, named)
        for name, file in weight_map.items():
            info = self.tensors.get(name)
            if info is None or info.file.name != file:
                raise CheckpointError(
                    f"{index}: tensor {name!r} should be in {file} but is not there."
                )

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(
                f"{self.folder}: tensor {name!r} is missing from the weights."
            ) from None

    def raw(self, name: str) -> np.ndarray:
        info = self.info(name)
        return self.files[info.file].raw(name)

    def read_f32(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """One tensor as a new float32 array, its shape checked against what the config says."""
        info = self.info(name)
        if shape is not None and tuple(shape) != info.shape:
            raise CheckpointError(
                f"{info.file}: tensor {name!r} has shape {list(info.shape)} but config.json "
                f"implies {list(shape)}. The config does not match the weights."
            )
        self.float_info(name)
        raw = self.raw(name)
        check_tensor(raw, info.dtype, name, info.file)  # NaN/inf refused, with the name
        out = to_f32(raw, info.dtype)
        self.files[info.file].release(name)
        return out

    def float_info(self, name: str) -> TensorInfo:
        """info(name) of a tensor read as float weights: CheckpointError naming the file and
        the tensor if its dtype is not BF16, F16 or F32."""
        info = self.info(name)
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{info.file}: tensor {name!r} has dtype {info.dtype}, expected BF16, F16 or F32."
            )
        return info

    def read_f32_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1 of a matrix as float32: lets a loader convert a large tensor
        (the 151936-row embedding) in chunks instead of holding it whole in f32."""
        info = self.float_info(name)
        raw = self.raw(name)[start:stop]
        check_tensor(raw, info.dtype, name, info.file)  # NaN/inf refused, with the name
        return to_f32(raw, info.dtype)

    def check_finite(self, name: str) -> None:
        """CheckpointError naming the tensor if it holds NaN or inf (its pages are released
        after the check)."""
        info = self.info(name)
        check_tensor(self.raw(name), info.dtype, name, info.file)
        self.release(name)

    def location(self, name: str) -> tuple[Path, int, int]:
        """(file, byte offset, byte count) of a tensor's data, for reading it without a map."""
        info = self.info(name)
        f = self.files[info.file]
        return info.file, f._data_start + info.begin, info.nbytes

    def release(self, name: str) -> None:
        info = self.info(name)
        self.files[info.file].release(name)

    def releaser(self, name: str) -> Callable[[], None]:
        info = self.info(name)
        return self.files[info.file].releaser(name)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits (uint16)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))
    return (rounded >> 16).astype(np.uint16)


def _stored_dtype(value, dtype: str | None) -> str:
    if dtype is not None:
        return dtype
    for name, (np_dtype, _) in DTYPES.items():
        if name != "BF16" and value.dtype == np_dtype:
            return name
    if value.dtype == np.uint16:
        return "BF16"  # raw bf16 bits (quantization scales)
    raise ValueError(f"no safetensors dtype for {value.dtype}")


def part_path(path: Path) -> Path:
    """Where save_safetensors writes `path` before renaming it: named for this process and
    thread (`<name>.<pid>-<thread>.part`), so concurrent writers of one file each have theirs."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}-{threading.get_native_id()}.part")


def save_safetensors(
    path: Path, tensors: dict, dtype: str | None = "BF16", metadata: dict[str, str] | None = None
) -> None:
    """Write tensors, one at a time, atomically (a .part file of this writer's own, part_path,
    renamed at the end: two processes writing the same file never write into one file, and a
    reader that mapped the finished one keeps it whole).

    dtype: BF16, F16 or F32 converts float tensors; None stores each array as it is (uint16
    arrays as BF16 bits). tensors: name -> array, or name -> (shape, make) where make()
    returns the array only when it is written, so a multi-GB checkpoint never sits in memory
    whole (that form needs a dtype).
    """
    shapes, kinds = {}, {}
    for name, v in tensors.items():
        array = isinstance(v, np.ndarray)
        shapes[name] = v.shape if array else tuple(v[0])
        kinds[name] = _stored_dtype(v, dtype) if array else dtype
    entries, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * DTYPES[kinds[name]][1]
        entries[name] = {
            "dtype": kinds[name],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    if metadata:
        entries["__metadata__"] = metadata
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    tmp = part_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(len(header).to_bytes(8, "little"))
            f.write(header)
            for name, value in tensors.items():
                arr = value if isinstance(value, np.ndarray) else value[1]()
                if tuple(arr.shape) != shapes[name]:
                    raise ValueError(f"{name}: made shape {arr.shape}, declared {shapes[name]}")
                kind = kinds[name]
                if kind == "BF16" and arr.dtype != np.uint16:
                    data = f32_to_bf16(arr)
                else:
                    data = np.ascontiguousarray(arr, dtype=DTYPES[kind][0])
                f.write(memoryview(data).cast("B"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
