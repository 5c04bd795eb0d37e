"""The quantized-weight disk cache under damage and faults: byte mutations of a cache file
never make a load raise or crash (the file is rejected and rebuilt, or it is still exactly
right); a full disk and a read-only folder while saving give a clear log line, a working model
and the previous files untouched."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time

import numpy as np
import pytest
from fuzzutil import fuzz, mutate_bytes, watchdog
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine import checkpoint, weight_cache
from merlin.engine.checkpoint import Checkpoint
from merlin.engine.config import load_config
from merlin.engine.model import load_model
from merlin.engine.rope import text_positions
from merlin.engine.text import TextModel


def run_logits(text_model):
    cache = text_model.new_cache(8)
    return text_model.forward(np.arange(1, 6), text_positions(0, 5), cache, logits="all")


@pytest.fixture(scope="module")
def cache_env(demo_dir, tmp_path_factory):
    """A cache folder holding the demo's q8 file; yields (folder, key, config, reference)."""
    folder = tmp_path_factory.mktemp("weight-cache")
    old = os.environ.get("MERLIN_WEIGHT_CACHE")
    os.environ["MERLIN_WEIGHT_CACHE"] = str(folder)
    try:
        model = load_model(demo_dir, weights="q8")
        cfg = load_config(demo_dir)
        with Checkpoint(demo_dir) as ckpt:
            key = weight_cache.cache_key(ckpt, cfg, "q8")
        assert (folder / f"{key}.safetensors").is_file()
        yield folder, key, cfg, run_logits(model.text)
    finally:
        if old is None:
            os.environ.pop("MERLIN_WEIGHT_CACHE", None)
        else:
            os.environ["MERLIN_WEIGHT_CACHE"] = old


@fuzz(100)
@given(data=st.data())
def test_damaged_cache_file_is_rejected_or_exact(cache_env, data):
    folder, key, cfg, reference = cache_env
    path = folder / f"{key}.safetensors"
    good = path.read_bytes()
    header = 8 + int.from_bytes(good[:8], "little")
    bad = mutate_bytes(good, data.draw, hot=header)
    path.write_bytes(bad)
    try:
        with watchdog():
            weights = weight_cache.load(key, cfg)  # never raises
        if weights is None:
            assert not path.exists()  # deleted, so the next load rebuilds it
        else:
            # an edit the checks cannot see (JSON whitespace, a padding byte): still exact
            logits = run_logits(TextModel(cfg.text, weights))
            assert np.array_equal(logits, reference)
            del weights
    finally:
        path.write_bytes(good)


def test_mis_shaped_cache_is_rejected(cache_env):
    """A header edit that keeps every byte count and checksum right but swaps a matrix's shape
    would make a Numba kernel index out of bounds: the shape check rejects it."""
    folder, key, cfg, _ = cache_env
    path = folder / f"{key}.safetensors"
    good = path.read_bytes()
    header = json.loads(good[8 : 8 + int.from_bytes(good[:8], "little")])
    # the gate_up weights of layer 0, row-major (qs) or grouped (packed), dims 0 and 1 swapped
    name = next(n for n in header if n.startswith("layers.0.gate_up.") and "scales" not in n)
    shape = header[name]["shape"]
    assert shape[0] != shape[1]
    swapped = [shape[1], shape[0], *shape[2:]]
    old = json.dumps(shape, separators=(",", ":")).encode()
    new = json.dumps(swapped, separators=(",", ":")).encode()
    old, new = b'"shape":' + old, b'"shape":' + new
    assert old in good and len(old) == len(new)
    path.write_bytes(good.replace(old, new, 1))
    try:
        assert weight_cache.load(key, cfg) is None
    finally:
        path.write_bytes(good)


def test_damaged_cache_file_is_said_to_be_rebuilt(cache_env, caplog):
    """The log line of a damaged cache file says it is converted again (a checkpoint file's
    message says to download it again: not something to do about a cache)."""
    folder, key, cfg, _ = cache_env
    path = folder / f"{key}.safetensors"
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    try:
        with caplog.at_level(logging.WARNING, logger="merlin.engine.weight_cache"):
            assert weight_cache.load(key, cfg) is None
        assert "converted again" in caplog.text and "download" not in caplog.text
    finally:
        path.write_bytes(good)


@pytest.mark.parametrize("field", ["crc32", "formats"])
def test_deeply_nested_cache_metadata_is_rejected(cache_env, field):
    """A metadata value nested deeper than the JSON parser's stack (RecursionError, not a
    ValueError) is a damaged cache like any other: deleted, converted again."""
    folder, key, cfg, _ = cache_env
    path = folder / f"{key}.safetensors"
    good = path.read_bytes()
    n = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + n])
    header["__metadata__"][field] = "[" * 100_000 + "]" * 100_000
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + good[8 + n :])
    try:
        assert weight_cache.load(key, cfg) is None
        assert not path.exists()
    finally:
        path.write_bytes(good)


# ---- full disk, read-only folder -----------------------------------------------------------------


@pytest.fixture
def fresh_cache(demo_dir, tmp_path, monkeypatch):
    """An empty cache folder with one unrelated older file in it (the 'previous data')."""
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(folder))
    previous = folder / ("0" * 24 + ".safetensors")
    checkpoint.save_safetensors(previous, {"x": np.arange(8, dtype=np.float32)}, dtype="F32")
    cfg = load_config(demo_dir)
    with Checkpoint(demo_dir) as ckpt:
        key = weight_cache.cache_key(ckpt, cfg, "q8")
    return folder, key, previous, previous.read_bytes()


def test_disk_full_while_saving(demo_dir, fresh_cache, caplog):
    """The cache file is written to checkpoint.part_path (this process's own .part file);
    making that a link to /dev/full gives the real ENOSPC from the kernel mid-write."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    folder, key, previous, previous_bytes = fresh_cache
    part = checkpoint.part_path(folder / f"{key}.safetensors")
    part.symlink_to("/dev/full")
    with caplog.at_level(logging.WARNING, logger="merlin.engine.weight_cache"):
        model = load_model(demo_dir, weights="q8")
    assert np.isfinite(run_logits(model.text)).all()  # the model works from memory
    message = caplog.text
    assert "could not write the weight cache" in message and str(folder) in message
    assert "No space left on device" in message
    assert not (folder / f"{key}.safetensors").exists()
    assert not part.exists() and not part.is_symlink()  # nothing half-written left
    assert previous.read_bytes() == previous_bytes
    # space again: the next load writes a good cache
    load_model(demo_dir, weights="q8")
    assert weight_cache.load(key, load_config(demo_dir)) is not None


def _read_only(folder, monkeypatch):
    """Make `folder` refuse writes: chmod for a normal user; root ignores permissions, so then
    every write, rename and delete under it fails with EROFS as on a read-only mount."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)

    def inside(p) -> bool:
        return os.path.abspath(os.fspath(p)).startswith(str(folder))

    def erofs(p):
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(p))

    real_open, real_replace, real_unlink, real_utime = open, os.replace, os.unlink, os.utime

    def open_(file, mode="r", *a, **k):
        if inside(file) and any(c in mode for c in "wax+"):
            raise erofs(file)
        return real_open(file, mode, *a, **k)

    def replace(src, dst, *a, **k):
        if inside(dst):
            raise erofs(dst)
        return real_replace(src, dst, *a, **k)

    def unlink(p, *a, **k):
        if inside(p):
            raise erofs(p)
        return real_unlink(p, *a, **k)

    def utime(p, *a, **k):
        if inside(p):
            raise erofs(p)
        return real_utime(p, *a, **k)

    monkeypatch.setattr(checkpoint, "open", open_, raising=False)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "utime", utime)
    return lambda: None


def test_read_only_folder_while_saving(demo_dir, fresh_cache, monkeypatch, caplog):
    folder, key, previous, previous_bytes = fresh_cache
    restore = _read_only(folder, monkeypatch)
    try:
        with caplog.at_level(logging.WARNING, logger="merlin.engine.weight_cache"):
            model = load_model(demo_dir, weights="q8")
        assert np.isfinite(run_logits(model.text)).all()
        assert "could not write the weight cache" in caplog.text
        assert str(folder) in caplog.text
        assert not (folder / f"{key}.safetensors").exists()
        assert previous.read_bytes() == previous_bytes
    finally:
        restore()


def test_read_only_folder_with_a_damaged_cache_file(demo_dir, fresh_cache, monkeypatch, caplog):
    """A corrupt cache file that cannot be deleted: the load converts again and logs; it never
    raises (it used to: the delete in the rejection path was unguarded)."""
    folder, key, previous, previous_bytes = fresh_cache
    bad = folder / f"{key}.safetensors"
    bad.write_bytes(previous_bytes[:20])
    restore = _read_only(folder, monkeypatch)
    try:
        with caplog.at_level(logging.WARNING, logger="merlin.engine.weight_cache"):
            model = load_model(demo_dir, weights="q8")
        assert np.isfinite(run_logits(model.text)).all()
        assert "unusable" in caplog.text
        assert bad.read_bytes() == previous_bytes[:20]  # could not be touched
    finally:
        restore()


def test_read_only_folder_with_a_good_cache_file(demo_dir, fresh_cache, monkeypatch):
    """Loading from a valid cache in a read-only folder works (the recency touch is skipped)."""
    folder, key, previous, _ = fresh_cache
    load_model(demo_dir, weights="q8")
    restore = _read_only(folder, monkeypatch)
    try:
        weights = weight_cache.load(key, load_config(demo_dir))
        assert weights is not None
    finally:
        restore()


def test_cache_folder_vanishes_during_eviction(demo_dir, fresh_cache, monkeypatch, caplog):
    folder, key, previous, _ = fresh_cache

    def evict(*a, **k):
        shutil.rmtree(folder)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(previous))

    monkeypatch.setattr(weight_cache, "evict", evict)
    with caplog.at_level(logging.WARNING, logger="merlin.engine.weight_cache"):
        model = load_model(demo_dir, weights="q8")
    assert np.isfinite(run_logits(model.text)).all()
    assert "could not trim the weight cache" in caplog.text


def test_two_writers_of_one_file_never_share_its_part(tmp_path):
    """Two writers of the same file at once (the app and `merlin-cli serve` converting one
    checkpoint): each writes its own .part, so the file that ends up in place is one whole
    write and a reader that mapped the first finished file still reads it whole after the
    second rename (one shared .part had truncated it under the mapping: SIGBUS)."""
    import threading

    path = tmp_path / "w.safetensors"
    second_may_finish = threading.Event()
    values = {}

    def writer(tag, wait_for=None):
        def make(n):
            if wait_for is not None:
                wait_for.wait(30)
            return np.full(n, tag, np.float32)

        tensors = {"x": ((1 << 16,), lambda: make(1 << 16)), "y": ((4,), lambda: make(4))}
        checkpoint.save_safetensors(path, tensors, "F32")

    slow = threading.Thread(target=writer, args=(2.0, second_may_finish))
    slow.start()  # opens its .part and waits inside the first tensor
    time.sleep(0.2)
    writer(1.0)  # finishes first and renames into place
    f = checkpoint.SafetensorsFile(path)
    try:
        mapped = f.raw("x")
        second_may_finish.set()
        slow.join(30)
        values["first"] = float(np.frombuffer(mapped, np.float32).sum())
    finally:
        f.close()
    f = checkpoint.SafetensorsFile(path)
    try:
        values["second"] = float(np.frombuffer(f.raw("x"), np.float32).sum())
    finally:
        f.close()
    assert values == {"first": 1.0 * (1 << 16), "second": 2.0 * (1 << 16)}
    assert not list(tmp_path.glob("*.part"))
