"""The quantized-weight disk cache: second load reads the cache and computes the same logits;
a corrupt or foreign file is detected, deleted and rebuilt."""

import mmap
import time

import numpy as np

from merlin.engine import weight_cache
from merlin.engine.model import load_model
from merlin.engine.rope import text_positions


def logits(model):
    ids = np.arange(1, 9)
    return model.text.forward(ids, text_positions(0, 8), model.new_cache(16), logits="all")


def test_cache_roundtrip_and_corruption(demo_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path))
    first = load_model(demo_dir, weights="q4")
    files = list(tmp_path.glob("*.safetensors"))
    assert len(files) == 1
    second = load_model(demo_dir, weights="q4")
    assert np.array_equal(logits(first), logits(second))
    # flip one byte in the data: the checksum catches it, the file is rebuilt
    data = bytearray(files[0].read_bytes())
    data[-100] ^= 0xFF
    files[0].write_bytes(bytes(data))
    third = load_model(demo_dir, weights="q4")
    assert np.array_equal(logits(first), logits(third))
    assert weight_cache.load(files[0].stem, first.config) is not None  # rewritten, valid
    # a truncated file as well
    files[0].write_bytes(files[0].read_bytes()[:1000])
    assert weight_cache.load(files[0].stem, first.config) is None
    assert not files[0].exists()


def _in_arena(a: np.ndarray) -> bool:
    """Whether a is a view of an anonymous mapping (engine/hugepages.py), not NumPy's heap."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, memoryview) and isinstance(a.obj, mmap.mmap)


def test_the_first_load_already_runs_on_the_cached_copy(demo_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path))
    first = load_model(demo_dir, weights="q4")
    layer = first.text.w.layers[0]
    assert all(_in_arena(a) for a in (layer.qkv.packed, layer.down.gscales, layer.input_norm))
    assert np.array_equal(logits(first), logits(load_model(demo_dir, weights="q4")))


def test_a_cache_that_does_not_read_back_converts_again(demo_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path))
    expected = logits(load_model(demo_dir, weights="q8"))
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    monkeypatch.setattr(weight_cache, "load", lambda *args, **kwargs: None)
    model = load_model(demo_dir, weights="q8")
    assert not _in_arena(model.text.w.layers[0].qkv.packed)  # the converted arrays
    assert np.array_equal(logits(model), expected)


def test_unwritable_cache_folder_still_loads(demo_dir, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(blocker / "weights"))
    model = load_model(demo_dir, weights="q8")
    assert np.isfinite(logits(model)).all()


def test_eviction_keeps_the_cap(tmp_path):
    names = [f"{i:024x}.safetensors" for i in range(3)]
    for name, size in zip(names, [100, 200, 300]):
        (tmp_path / name).write_bytes(b"x" * size)
    weight_cache.evict(tmp_path, cap_bytes=350, keep=tmp_path / names[0])
    left = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert names[0] in left and sum((tmp_path / n).stat().st_size for n in left) <= 350


def test_eviction_removes_only_the_caches_own_files(tmp_path):
    """MERLIN_WEIGHT_CACHE pointed at a folder of the user's own (the low-disk warning invites
    it): eviction had removed every *.safetensors and old *.part there. Only the cache's
    names go: {key}.safetensors, {key}-L{i}.safetensors and their writers' temporaries."""
    import os

    old = time.time() - 2 * weight_cache.STALE_PART_SECONDS
    own = ["0123456789abcdef01234567.safetensors", "0123456789abcdef01234567-L3.safetensors"]
    stale = ["89abcdef0123456789abcdef.safetensors.4242-4243.part",
             "89abcdef0123456789abcdef.safetensors.part"]  # fmt: skip
    users = ["my-finetune.safetensors", "video.mp4.part", "model.safetensors"]
    for name in own + stale + users:
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (old, old))
    weight_cache.evict(tmp_path, cap_bytes=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(users)


def test_two_checkpoints_with_the_same_sizes_and_times_do_not_share_an_entry(
    demo_dir, tmp_path, monkeypatch
):
    """Two fine-tunes of one base (same config, so same file sizes) copied with their times
    kept (cp -p, rsync -a, tar): each runs its own weights, not the first one's cached copy."""
    import json
    import os
    import shutil

    from merlin.engine.demo import write_random_checkpoint

    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "cache"))
    config = json.loads((demo_dir / "config.json").read_text())
    folders = {}
    for name, seed in (("a", 1), ("b", 2)):
        folder = tmp_path / name
        shutil.copytree(demo_dir, folder)
        write_random_checkpoint(folder, config, seed)
        os.utime(folder / "model.safetensors", ns=(1_700_000_000_000_000_000,) * 2)
        folders[name] = folder
    a, b = (folders[n] / "model.safetensors" for n in "ab")
    assert a.stat().st_size == b.stat().st_size and a.read_bytes() != b.read_bytes()
    first = logits(load_model(folders["a"], weights="q8"))
    second = logits(load_model(folders["b"], weights="q8"))
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 2
    assert not np.array_equal(first, second)
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "fresh"))
    assert np.array_equal(second, logits(load_model(folders["b"], weights="q8")))
