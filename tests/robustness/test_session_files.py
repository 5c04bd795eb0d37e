"""Saved sessions: everything a file says is checked against the loaded model before it sizes
or indexes anything (the KV cache is sized from the model), and `--session FILE` never
replaces a file that is not one of our sessions of a format this Merlin reads.

Crafted files are written with engine.arrayfile, so their checksums are valid and the model
identity matches: only the checks of engine.session_check stand between them and the kernels.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
from fuzzutil import JUNK_VALUES, fuzz
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine import arrayfile
from merlin.engine.session import SESSION_KIND, Session


@pytest.fixture(scope="module")
def saved(demo_model, tmp_path_factory):
    """(meta, arrays) of a real saved session with an image and two turns."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("saved")
    img = folder / "red.png"
    Image.new("RGB", (64, 64), (220, 20, 20)).save(img)
    s = Session(demo_model)
    for _ in s.ask("what is this?", images=[str(img)], max_new_tokens=3):
        pass
    for _ in s.ask("and the colour?", max_new_tokens=3):
        pass
    path = folder / "good.msession"
    s.save(path)
    with arrayfile.Reader(path, SESSION_KIND) as r:
        arrays = {name: r.read(name) for name in r.entries}
        meta = r.meta
    return meta, arrays, path


def write(path, meta, arrays):
    arrayfile.write(
        path, SESSION_KIND, meta, [arrayfile.array_spec(n, a) for n, a in arrays.items()]
    )


def restore(model, path):
    t0 = time.perf_counter()
    s, result = Session.open(model, path)
    assert time.perf_counter() - t0 < 20
    return s, result


def test_good_file_restores(demo_model, saved):
    _, _, path = saved
    s, result = restore(demo_model, path)
    assert result.restored, result.reason


CACHE_EDITS = [
    ("head_dim", 2),
    ("head_dim", 0),
    ("layers", 10**7),
    ("layers", -1),
    ("layers", 1),
    ("kv_heads", 64),
    ("length", 1.5),
    ("length", -1),
    ("length", 10**12),
    ("fmt", "q8"),
]


@pytest.mark.parametrize("key, value", CACHE_EDITS)
def test_cache_description_must_match_the_model(demo_model, saved, tmp_path, key, value):
    meta, arrays, _ = saved
    meta = copy.deepcopy(meta)
    meta["cache"][key] = value
    write(tmp_path / "s.msession", meta, arrays)
    s, result = restore(demo_model, tmp_path / "s.msession")
    assert not result.restored and result.reason
    t = demo_model.config.text
    assert s.cache.head_dim == t.head_dim and s.cache.n_layers == t.num_hidden_layers
    # the conversation goes on, recomputed
    events = list(s.ask("next?", max_new_tokens=2))
    assert events[-1].reason in ("max_tokens", "stop_token")


def _edit_image(meta, **changes):
    meta = copy.deepcopy(meta)
    meta["messages"][0]["images"][0].update(changes)
    return meta


META_EDITS = [
    lambda m: _edit_image(m, grid_thw=[1, 4]),
    lambda m: _edit_image(m, grid_thw=[1, 100000, 100000]),
    lambda m: _edit_image(m, grid_thw=[1.5, 4, 4]),
    lambda m: _edit_image(m, merge_size=0),
    lambda m: _edit_image(m, merge_size=3),
    lambda m: _edit_image(m, hash="../../etc/passwd"),
    lambda m: dict(m, spans=[[0.5, 3, "ab"]]),
    lambda m: dict(m, spans=[[5, 2, m["spans"][0][2]]]),
    lambda m: dict(m, spans=[[0, 10**9, m["spans"][0][2]]]),
    lambda m: dict(m, rope_delta=1.5),
    lambda m: dict(m, rope_delta=10**40),
    lambda m: dict(m, dropped=[10**9]),
    lambda m: dict(m, messages=[{"role": "assistant", "text": "x" * 20_000_000}]),
    lambda m: dict(m, messages=[{"role": "user", "text": 5}]),
    lambda m: dict(m, messages="hi"),
]


@pytest.mark.parametrize("edit", range(len(META_EDITS)))
def test_crafted_metadata_is_refused_or_harmless(demo_model, saved, tmp_path, edit):
    meta, arrays, _ = saved
    write(tmp_path / "s.msession", META_EDITS[edit](copy.deepcopy(meta)), arrays)
    s, result = restore(demo_model, tmp_path / "s.msession")
    assert not result.restored and result.reason


ARRAY_EDITS = {
    "tokens as floats": lambda a: dict(a, tokens=a["tokens"].astype(np.float64) + 0.5),
    "token past the vocabulary": lambda a: dict(a, tokens=a["tokens"] + 10**6),
    "positions as floats": lambda a: dict(a, positions=a["positions"].astype(np.float32)),
    "negative positions": lambda a: dict(a, positions=a["positions"] - 10**12),
    "embedding rows short": lambda a: {
        k: (v[:-1] if k.endswith(".embeds") else v) for k, v in a.items()
    },
    "nan embedding": lambda a: {
        k: (np.full_like(v, np.nan) if k.endswith(".embeds") else v) for k, v in a.items()
    },
}


@pytest.mark.parametrize("name", list(ARRAY_EDITS))
def test_crafted_arrays_are_refused(demo_model, saved, tmp_path, name):
    meta, arrays, _ = saved
    write(tmp_path / "s.msession", meta, ARRAY_EDITS[name](dict(arrays)))
    s, result = restore(demo_model, tmp_path / "s.msession")
    assert not result.restored and result.reason


@fuzz(30)
@given(
    where=st.sampled_from(["cache", "top", "message", "image"]),
    key=st.sampled_from(
        [
            "length",
            "layers",
            "kv_heads",
            "head_dim",
            "fmt",
            "spans",
            "images",
            "rope_delta",
            "dropped",
            "grid_thw",
            "merge_size",
            "hash",
            "text",
            "role",
            "images",
            "source",
        ]
    ),
    value=st.sampled_from(JUNK_VALUES),
)
def test_generated_metadata_edits(demo_model, saved, tmp_path_factory, where, key, value):
    """Any value in any field: the session opens (restored or not), never a traceback, and a
    next turn works."""
    meta, arrays, _ = saved
    meta = copy.deepcopy(meta)
    target = {
        "cache": meta["cache"],
        "top": meta,
        "message": meta["messages"][0],
        "image": meta["messages"][0]["images"][0],
    }[where]
    target[key] = value
    path = tmp_path_factory.mktemp("gen") / "s.msession"
    try:
        write(path, meta, arrays)
    except (TypeError, ValueError):
        return  # not JSON-serialisable: such a file cannot exist
    s, result = restore(demo_model, path)
    if result.restored:
        t = demo_model.config.text
        assert s.cache.head_dim == t.head_dim and s.cache.n_kv_heads == t.num_key_value_heads
    events = list(s.ask("go on", max_new_tokens=1))
    assert events[-1].reason in ("max_tokens", "stop_token")


# ---- --session never replaces what is not ours --------------------------------------------------


def _kv_file(path, demo_model):
    demo_model.new_cache(16).save(path)


def _newer_session(path, saved):
    meta, arrays, _ = saved
    meta = copy.deepcopy(meta)
    meta["identity"]["format"] = 99
    write(path, meta, arrays)


@pytest.mark.parametrize("kind", ["text", "kv", "newer", "truncated", "empty"])
def test_chat_session_refuses_to_overwrite(demo_model, saved, tmp_path, kind, monkeypatch, capsys):
    import io
    import sys

    from merlin.engine import cli

    path = tmp_path / "notes.txt"
    if kind == "text":
        path.write_text("my notes\n")
    elif kind == "kv":
        _kv_file(path, demo_model)
    elif kind == "newer":
        _newer_session(path, saved)
    elif kind == "truncated":
        data = saved[2].read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"")
    before = path.read_bytes()
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    from merlin.engine.commands import chat as chat_command

    monkeypatch.setattr(chat_command, "load", lambda args: pytest.fail("work started"))
    code = cli.main(["chat", "--session", str(path), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USER_ERROR and "not changed" in err and "Traceback" not in err
    assert path.read_bytes() == before


def test_chat_session_continues_our_own_file(demo_model, saved, tmp_path):
    from merlin.engine.session_check import check_target

    check_target(saved[2])  # ours, this format: may be replaced
    check_target(tmp_path / "new.msession")  # absent: may be created


@pytest.mark.parametrize("damage", ["kv byte flipped", "token history"])
def test_a_damaged_cache_keeps_the_intact_image_embeddings(demo_model, saved, tmp_path, damage):
    """The cached rows are dropped, but a picture whose embedding is intact in the file needs
    neither its pixels nor its file to go on (the file itself stays as it was)."""
    meta, arrays, good = saved
    meta = copy.deepcopy(meta)
    meta["messages"][0]["images"][0]["source"] = str(tmp_path / "gone.png")  # no such file
    path = tmp_path / "s.msession"
    if damage == "kv byte flipped":
        write(path, meta, arrays)
        good = path
        data = bytearray(good.read_bytes())
        with arrayfile.Reader(good, SESSION_KIND) as r:
            kv = next(n for n in r.entries if n.startswith("kv.") and r.entries[n]["offset"])
            data[r.entries[kv]["offset"] + 100] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        edited = dict(arrays)
        edited["tokens"] = arrays["tokens"].copy()
        edited["tokens"][-1] = demo_model.config.text.vocab_size  # outside the vocabulary
        write(path, meta, edited)
    before = path.read_bytes()
    s, result = restore(demo_model, path)
    assert not result.restored and result.reason
    hashes = [im.hash for im in s.messages[0].images]
    assert result.images_kept == len(hashes) == 1
    emb = s._embeddings[hashes[0]]
    assert np.array_equal(emb.embeds, arrays[f"img.{hashes[0]}.embeds"])
    assert all(im.prepared is None for im in s.messages[0].images)  # no pixels needed
    for _ in s.ask("and now?", max_new_tokens=2):  # the picture's file is not consulted
        pass
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "key, value, kept", [("kv", "other", 1), ("weights", "other", 1), ("checkpoint", "2:x", 0)]
)
@pytest.mark.parametrize("picture", ["gone", "changed"])
def test_another_text_format_keeps_the_image_embeddings(
    demo_model, saved, tmp_path, key, value, kept, picture
):
    """A session saved with other text weights or another KV format (`--weights`, `--kv`):
    its rows are recomputed, but a picture whose file is gone, or has other pixels since,
    had made every turn fail, though the file holds its embedding, which those formats do
    not change; another checkpoint's embeddings are never kept."""
    from PIL import Image

    meta, arrays, _ = saved
    meta = copy.deepcopy(meta)
    source = tmp_path / f"{picture}.png"
    if picture == "changed":
        Image.new("RGB", (64, 64), (20, 20, 220)).save(source)
    meta["messages"][0]["images"][0]["source"] = str(source)
    meta["identity"][key] = value
    path = tmp_path / "s.msession"
    write(path, meta, arrays)
    s, result = restore(demo_model, path)
    assert not result.restored and result.images_kept == kept
    if kept:
        for _ in s.ask("and now?", max_new_tokens=2):  # the picture's file is not consulted
            pass


def test_a_damaged_embedding_is_not_kept(demo_model, saved, tmp_path):
    meta, arrays, _ = saved
    edited = dict(arrays)
    name = next(n for n in arrays if n.endswith(".embeds"))
    edited[name] = arrays[name][:-1].copy()  # one row short of its image
    edited["tokens"] = arrays["tokens"].copy()
    edited["tokens"][-1] = -1
    write(tmp_path / "s.msession", meta, edited)
    s, result = restore(demo_model, tmp_path / "s.msession")
    assert not result.restored and result.images_kept == 0
    assert not s._embeddings
