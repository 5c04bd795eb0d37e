"""Converted text weights cached on disk, so the second load of a checkpoint in a format is
a copy from the page cache instead of a quantization pass.

Loaded arrays are copied out of the file's map into one anonymous mapping on 2 MB pages
(engine/hugepages.py), one tensor at a time (each tensor's file pages released after its copy,
so peak memory stays near the weights): decode streams every weight once per token, and
mapped file pages are 4 KB. (Copies into NumPy's own arrays gained 52.5 vs 54.7 ms (q4) and
70.7 vs 72.6 ms (q8) a step over the mapped file; one huge-page arena for all of them gains
more: docs/kernels.md, "Weights on huge pages".)

Key: the checkpoint's identity (config hash, each weights file's name, size, mtime and sampled
bytes: cache_key), the format and the engine's quantization version. The file is safetensors
(read by our own checked reader) with a CRC32 per tensor in its metadata; a file that fails any
check is deleted and rebuilt. The folder is kept under a size cap by evicting the least
recently used files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
from platformdirs import user_cache_dir

from . import file_sample
from .checkpoint import Checkpoint, SafetensorsFile, save_safetensors
from .config import ModelConfig
from .errors import CheckpointError
from .hugepages import Arena, arena_bytes
from .kernels.qgroup import LAYOUT, Q4_BLOCK_BYTES, Q8_BLOCK_BYTES
from .linear import GROUP, WEIGHT_FORMATS, GroupLinear, linear_from_arrays, linear_kind
from .moe import cache as moe_cache
from .moe.weights import KINDS as EXPERT_KINDS
from .quant import BLOCK
from .text import LayerWeights, TextWeights

log = logging.getLogger(__name__)

CACHE_VERSION = 5  # bump when the quantized layout or the file's naming changes
DEFAULT_CAP_BYTES = 8 * 1024**3
# A .part file not written to for this long is a write that was killed (kill -9, power loss):
# evict() removes it. A write in progress touches its file every few milliseconds.
STALE_PART_SECONDS = 600


def cache_dir() -> Path:
    return Path(os.environ.get("MERLIN_WEIGHT_CACHE") or Path(user_cache_dir("merlin")) / "weights")


ROOM_MARGIN = 256 * 1024**2  # left free on the cache's disk besides the file


def free_bytes() -> int | None:
    """Free space on the disk of the cache folder (its nearest existing parent), or None."""
    folder = cache_dir()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def has_room(nbytes: int) -> bool:
    """Whether a cache entry of nbytes fits on the cache folder's disk (logged when not):
    without the room a conversion would write until the disk is full, every start, and
    leave what it wrote behind."""
    free = free_bytes()
    if free is None or free >= nbytes + ROOM_MARGIN:
        return True
    log.warning(
        "the weight cache in %s has %.1f GB free, the converted weights need %.1f GB: they "
        "are converted in memory at every start. Free some space or set MERLIN_WEIGHT_CACHE "
        "to a folder on a larger disk.",
        cache_dir(),
        free / 1e9,
        nbytes / 1e9,
    )
    return False


def cache_key(ckpt: Checkpoint, cfg: ModelConfig, fmt: str) -> str:
    """The key of a checkpoint's converted weights: its config, its weight files' names,
    sizes, times and sampled bytes (file_sample.py: two fine-tunes of one base model copied
    with their times kept must not share an entry), the format and the layout's versions."""
    files = file_sample.digest(sorted(ckpt.files, key=lambda p: p.name))
    blob = json.dumps([cfg.identity, files, fmt, CACHE_VERSION, LAYOUT])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def _flatten(w: TextWeights) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    arrays, formats = {}, {}

    def add_linear(name, lin):
        formats[name] = linear_kind(lin)
        for part, a in lin.arrays().items():
            arrays[f"{name}.{part}"] = a

    for i, lw in enumerate(w.layers):
        p = f"layers.{i}."
        for n in ("qkv", "o") if lw.moe is not None else ("qkv", "o", "gate_up", "down"):
            add_linear(p + n, getattr(lw, n))
        if lw.moe is not None:  # a routed layer: its experts have a file of their own
            formats[p + "experts"] = lw.moe.kind
        for n in ("input_norm", "q_norm", "k_norm", "post_norm"):
            arrays[p + n] = getattr(lw, n)
    add_linear("embed", w.embed)
    if w.lm_head is not w.embed:
        add_linear("lm_head", w.lm_head)
    arrays["norm"] = w.norm
    return arrays, formats


def _unflatten(arrays: dict[str, np.ndarray], formats: dict[str, str], cfg: ModelConfig, experts):
    def parts(name):
        prefix = name + "."
        return {k[len(prefix) :]: a for k, a in arrays.items() if k.startswith(prefix)}

    def linear(name):
        return linear_from_arrays(formats[name], parts(name))

    layers = []
    for i in range(cfg.text.num_hidden_layers):
        p = f"layers.{i}."
        if cfg.text.is_moe_layer(i):
            layers.append(
                LayerWeights(
                    input_norm=arrays[p + "input_norm"],
                    qkv=linear(p + "qkv"),
                    o=linear(p + "o"),
                    q_norm=arrays[p + "q_norm"],
                    k_norm=arrays[p + "k_norm"],
                    post_norm=arrays[p + "post_norm"],
                    gate_up=None,
                    down=None,
                    moe=experts(i, formats[p + "experts"]),
                )
            )
            continue
        layers.append(
            LayerWeights(
                input_norm=arrays[p + "input_norm"],
                qkv=linear(p + "qkv"),
                o=linear(p + "o"),
                q_norm=arrays[p + "q_norm"],
                k_norm=arrays[p + "k_norm"],
                post_norm=arrays[p + "post_norm"],
                gate_up=linear(p + "gate_up"),
                down=linear(p + "down"),
            )
        )
    embed = linear("embed")
    head = linear("lm_head") if "lm_head" in formats else embed
    return TextWeights(embed=embed, layers=layers, norm=arrays["norm"], lm_head=head)


def _check_linear(name: str, lin, out_features: int, in_features: int) -> None:
    """The arrays of a cached matrix have the dtypes and shapes the kernels index with (a
    mis-shaped array would make a Numba kernel read out of bounds, not raise)."""
    if lin.fmt == "f32":
        arrays = {"w": (lin.w, (np.float32,), (out_features, in_features))}
    elif isinstance(lin, GroupLinear):
        if in_features % BLOCK or lin.out_features != out_features:
            raise CheckpointError(f"{name} has {lin.out_features} rows, not {out_features}")
        groups, blocks = -(-out_features // GROUP), in_features // BLOCK
        dtype, width = (np.uint8, Q4_BLOCK_BYTES) if lin.kind == "q4" else (np.int8, Q8_BLOCK_BYTES)
        arrays = {
            "packed": (lin.packed, (dtype,), (groups, blocks, width)),
            "gscales": (lin.gscales, (np.uint16,), (groups, blocks, GROUP)),  # bf16 bits
        }
    else:  # row-major: q8 only
        if in_features % BLOCK or lin.fmt != "q8":
            raise CheckpointError(f"{name} cannot be {lin.fmt}")
        width, qs_dtype = in_features, np.int8
        arrays = {
            "qs": (lin.qt.qs, (qs_dtype,), (out_features, width)),
            # bf16 bits; the kernels also take float32 scales
            "scales": (
                lin.qt.scales,
                (np.uint16, np.float32),
                (out_features, in_features // BLOCK),
            ),
        }
    for part, (a, dtypes, shape) in arrays.items():
        if a.dtype not in dtypes or a.shape != shape:
            raise CheckpointError(f"{name}.{part} is {a.dtype}{list(a.shape)}, not {shape}")


def _check_weights(w: TextWeights, cfg: ModelConfig) -> None:
    t = cfg.text
    d, hd = t.hidden_size, t.head_dim
    for i, lw in enumerate(w.layers):
        p = f"layers.{i}."
        _check_linear(p + "qkv", lw.qkv, t.q_size + 2 * t.kv_size, d)
        _check_linear(p + "o", lw.o, d, t.q_size)
        if lw.moe is None:  # experts_from_arrays checked a routed layer's shapes
            _check_linear(p + "gate_up", lw.gate_up, 2 * t.intermediate_size, d)
            _check_linear(p + "down", lw.down, d, t.intermediate_size)
        for n, size in (("input_norm", d), ("q_norm", hd), ("k_norm", hd), ("post_norm", d)):
            a = getattr(lw, n)
            if a.dtype != np.float32 or a.shape != (size,):
                raise CheckpointError(f"{p}{n} is {a.dtype}{list(a.shape)}")
    _check_linear("embed", w.embed, t.vocab_size, d)
    _check_linear("lm_head", w.lm_head, t.vocab_size, d)
    if w.norm.dtype != np.float32 or w.norm.shape != (d,):
        raise CheckpointError(f"norm is {w.norm.dtype}{list(w.norm.shape)}")


def load(key: str, cfg: ModelConfig, map_experts: bool = False) -> TextWeights | None:
    """The cached weights, or None (missing, foreign or corrupt: corrupt files are deleted).
    map_experts: a mixture-of-experts model's experts stay views of their mapped files
    (engine.moe.cache) instead of copies.

    Never raises for a bad file: every check failure means "convert again"."""
    path = cache_dir() / f"{key}.safetensors"
    if not path.is_file():
        return None
    try:
        f = SafetensorsFile(path, remedy="it is converted again")
        try:
            meta = f.metadata
            if meta.get("key") != key:
                raise CheckpointError("the file's key does not match its name")
            crcs = json.loads(meta["crc32"])
            formats = json.loads(meta["formats"])
            if not isinstance(crcs, dict) or not isinstance(formats, dict):
                raise CheckpointError("the metadata is damaged")
            kinds = set(WEIGHT_FORMATS) | set(GroupLinear.KINDS) | set(EXPERT_KINDS)
            if not all(kind in kinds for kind in formats.values()):
                raise CheckpointError("unknown weight format")
            arrays = {}
            arena = Arena(arena_bytes(f.tensors.values()))
            for name in f.tensors:
                a = arena.copy(f.raw(name))  # anonymous memory, huge pages (docstring)
                f.release(name)
                if _crc(a) != crcs.get(name):
                    raise CheckpointError(f"checksum mismatch in {name}")
                arrays[name] = a
            if set(crcs) != set(arrays):
                raise CheckpointError("tensors are missing")
            folder = cache_dir()

            def experts(i, kind):
                return moe_cache.load_layer(folder, key, i, kind, cfg, map_experts)

            weights = _unflatten(arrays, formats, cfg, experts)
            _check_weights(weights, cfg)
        finally:
            f.close()  # the arrays are copies
    except (CheckpointError, KeyError, ValueError, TypeError, AttributeError, RecursionError) as e:
        log.warning("weight cache %s is unusable (%s); rebuilding it", path, e)
        try:
            for p in path.parent.glob(f"{key}-L*.safetensors"):
                p.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
        except OSError as e2:  # read-only cache folder: the next store() fails and logs too
            log.warning("could not delete %s (%s)", path, e2.strerror or e2)
        return None
    try:
        os.utime(path)  # recently used
    except OSError:
        pass  # read-only cache folder: eviction order only
    return weights


def store(key: str, weights: TextWeights, cap_bytes: int = DEFAULT_CAP_BYTES) -> bool:
    """Write the cache file; whether it was written. A failure (disk full, read-only folder)
    is logged, not raised."""
    folder = cache_dir()
    arrays, formats = _flatten(weights)
    for i, lw in enumerate(weights.layers):  # routed layers an ExpertSink has not written
        if lw.moe is not None and not moe_cache.layer_path(folder, key, i).is_file():
            if moe_cache.store_layer(folder, key, i, lw.moe) is None:
                return False
    meta = {
        "key": key,
        "formats": json.dumps(formats),
        "crc32": json.dumps({n: _crc(a) for n, a in arrays.items()}),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        save_safetensors(folder / f"{key}.safetensors", arrays, dtype=None, metadata=meta)
    except OSError as e:
        log.warning(
            "could not write the weight cache in %s (%s); the next load converts again",
            folder,
            e.strerror or e,
        )
        return False
    try:
        evict(folder, cap_bytes, keep=folder / f"{key}.safetensors")
    except OSError as e:  # another process removed a file meanwhile, or a read-only file
        log.warning("could not trim the weight cache in %s (%s)", folder, e.strerror or e)
    return True


# the names of the cache's own files: {key}.safetensors, {key}-L{i}.safetensors (engine.moe.
# cache) and their writers' temporaries (checkpoint.part_path: NAME.{pid}-{thread}.part, and
# NAME.part of older Merlins); nothing else in the folder is ever removed (MERLIN_WEIGHT_CACHE
# may name a folder that holds the user's own files)
_OWN_FILE = re.compile(r"[0-9a-f]{24}(-L\d+)?\.safetensors")
_OWN_PART = re.compile(r"[0-9a-f]{24}(-L\d+)?\.safetensors(\.\d+-\d+)?\.part")


def evict(folder: Path, cap_bytes: int, keep: Path | None = None) -> None:
    """Remove stale temporaries and the least recently used entries over cap_bytes: only
    files named as the cache names its own (_OWN_FILE, _OWN_PART)."""
    now = time.time()
    for p in folder.glob("*.part"):
        if not _OWN_PART.fullmatch(p.name):
            continue
        try:
            if now - p.stat().st_mtime > STALE_PART_SECONDS:
                p.unlink()
        except OSError:
            pass  # another process finished or removed it meanwhile
    # a model's files (its own and one per routed layer, engine.moe.cache) go together
    groups: dict[str, list[Path]] = {}
    for p in folder.glob("*.safetensors"):
        if _OWN_FILE.fullmatch(p.name):
            groups.setdefault(moe_cache.group_key(p), []).append(p)
    kept = moe_cache.group_key(keep) if keep is not None else None
    order = sorted(groups, key=lambda g: max(p.stat().st_mtime for p in groups[g]))
    total = sum(p.stat().st_size for ps in groups.values() for p in ps)
    for g in order:
        if total <= cap_bytes:
            break
        if g != kept:
            for p in groups[g]:
                total -= p.stat().st_size
                p.unlink(missing_ok=True)
