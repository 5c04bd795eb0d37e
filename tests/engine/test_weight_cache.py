"""The quantized-weight disk cache: second load reads the cache and computes the same logits;
a corrupt or foreign file is detected, deleted and rebuilt."""

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


def test_unwritable_cache_folder_still_loads(demo_dir, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(blocker / "weights"))
    model = load_model(demo_dir, weights="q8")
    assert np.isfinite(logits(model)).all()


def test_eviction_keeps_the_cap(tmp_path):
    for i, size in enumerate([100, 200, 300]):
        p = tmp_path / f"{i}.safetensors"
        p.write_bytes(b"x" * size)
    weight_cache.evict(tmp_path, cap_bytes=350, keep=tmp_path / "0.safetensors")
    left = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert "0.safetensors" in left and sum((tmp_path / n).stat().st_size for n in left) <= 350
