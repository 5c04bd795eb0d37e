"""Quantized experts in the weight cache: one file per routed layer, `{key}-L{i}.safetensors`
next to the model's `{key}.safetensors` (engine.weight_cache), which holds everything else
and names each layer's expert format.

Why a file per layer: the experts are 97% of a 30B-A3B model (17 GB at q4). Written as each
layer is converted (ExpertSink), a layer's arrays can be replaced at once by views of the
file just written, so a first load with memory-mapped experts never holds more than one
layer of them in anonymous memory; and a load from the cache can map them (map=True: the
arrays are read-only views of the file, the OS pages them in and out; a 16 GB machine runs
the model from disk) or copy them (map=False: anonymous memory, as the dense weights).

Each file is safetensors with the layer's key, index and a CRC32 per tensor in its metadata;
a file that fails a check makes the whole cache entry invalid (the caller deletes the group).
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path

import numpy as np

from ..checkpoint import SafetensorsFile, save_safetensors
from ..config import ModelConfig
from ..errors import CheckpointError
from .weights import ExpertWeights, experts_from_arrays

log = logging.getLogger(__name__)


def layer_path(folder: Path, key: str, i: int) -> Path:
    return folder / f"{key}-L{i}.safetensors"


def group_key(path: Path) -> str:
    """The cache entry a file belongs to ({key}.safetensors, {key}-L{i}.safetensors)."""
    return path.name.split(".")[0].split("-L")[0]


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def store_layer(folder: Path, key: str, i: int, ew: ExpertWeights) -> Path | None:
    """Write layer i's experts (atomically); None (logged) when the folder is not writable."""
    path = layer_path(folder, key, i)
    arrays = ew.arrays()
    meta = {
        "key": key,
        "layer": str(i),
        "kind": ew.kind,
        "crc32": json.dumps({n: _crc(a) for n, a in arrays.items()}),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        save_safetensors(path, arrays, dtype=None, metadata=meta)
    except OSError as e:
        log.warning("could not write %s (%s)", path, e.strerror or e)
        return None
    return path


def load_layer(
    folder: Path, key: str, i: int, kind: str, cfg: ModelConfig, mapped: bool
) -> ExpertWeights:
    """Layer i's experts from its file, mapped or copied; CheckpointError when unusable."""
    path = layer_path(folder, key, i)
    if not path.is_file():
        raise CheckpointError(f"{path.name} is missing")
    f = SafetensorsFile(path, remedy="it is converted again")
    try:
        meta = f.metadata
        if meta.get("key") != key or meta.get("layer") != str(i) or meta.get("kind") != kind:
            raise CheckpointError(f"{path.name} belongs to another model or layer")
        try:
            crcs = json.loads(meta["crc32"])
        except (KeyError, ValueError, RecursionError):  # RecursionError: nested too deeply
            raise CheckpointError(f"{path.name}: the metadata is damaged") from None
        arrays = {}
        for name in f.tensors:
            a = f.raw(name) if mapped else np.array(f.raw(name))
            if _crc(a) != crcs.get(name):
                raise CheckpointError(f"checksum mismatch in {path.name}: {name}")
            f.release(name)  # mapped: the pages come back from the file when a token needs them
            arrays[name] = a
        if set(crcs) != set(arrays):
            raise CheckpointError(f"{path.name}: tensors are missing")
        return experts_from_arrays(kind, arrays, cfg, f"layers.{i}.experts")
    finally:
        f.close()  # mapped views keep the map alive


class ExpertSink:
    """Called by the loader with each routed layer's converted experts: writes the layer's
    cache file and, with map=True, hands back views of that file in place of the arrays
    (the anonymous copy is freed before the next layer is converted)."""

    def __init__(self, folder: Path, key: str, cfg: ModelConfig, mapped: bool):
        self.folder, self.key, self.cfg, self.mapped = folder, key, cfg, mapped

    def __call__(self, i: int, ew: ExpertWeights) -> ExpertWeights:
        path = store_layer(self.folder, self.key, i, ew)
        if path is None or not self.mapped:
            return ew
        try:
            return load_layer(self.folder, self.key, i, ew.kind, self.cfg, mapped=True)
        except CheckpointError as e:
            log.warning("cannot map %s (%s); its experts stay in memory", path, e)
            return ew
