"""Fuzzing the JSON files of a checkpoint folder: config.json (structure edits and byte edits),
generation_config.json and preprocessor_config.json, then whole loads of the demo checkpoint
with a damaged config (inconsistent sizes must be caught before anything is allocated for
them, and a model that loads must run).

Every case ends in a parsed value / a working model, or a CheckpointError with a message.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from fuzzutil import attempt, dumps, fuzz, mutate_bytes, mutate_json, traced, watchdog
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine.config import MAX_LAYERS, ModelConfig, load_config, parse_config
from merlin.engine.errors import CheckpointError, InputError, MerlinError
from merlin.engine.memory import estimate_memory
from merlin.engine.model import load_model, read_generation_defaults
from merlin.engine.rope import text_positions
from merlin.engine.tokenizer import Tokenizer
from merlin.engine.vision.preprocess import PIXEL_LIMIT, PreprocessConfig, load_preprocess_config


def workspace(demo_dir, dst):
    """A writable copy of the demo folder whose weights are a symlink (not copied)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in demo_dir.iterdir():
        if p.suffix == ".safetensors":
            (dst / p.name).symlink_to(p)
        else:
            shutil.copy(p, dst / p.name)
    return dst


@pytest.fixture(scope="module")
def ws(demo_dir, tmp_path_factory):
    return workspace(demo_dir, tmp_path_factory.mktemp("fuzz-config") / "ckpt")


@pytest.fixture(scope="module")
def demo_config(demo_dir):
    return json.loads((demo_dir / "config.json").read_text())


def size_keys(path) -> bool:
    """Paths into the sizes and ids (the interesting part of a config)."""
    return any(k in ("text_config", "vision_config", "rope_scaling") for k in path) or (
        len(path) == 1 and str(path[0]).endswith(("_id", "embeddings"))
    )


@fuzz(800)
@given(data=st.data())
def test_parse_config_structure_edits(demo_config, data):
    raw = mutate_json(demo_config, data.draw, focus=size_keys if data.draw(st.booleans()) else None)
    out = attempt(parse_config, raw, "config.json")
    if out.ok:
        cfg = out.result
        assert isinstance(cfg, ModelConfig)
        t = cfg.text
        assert 0 < t.num_hidden_layers <= MAX_LAYERS
        assert t.head_dim % 2 == 0 and sum(t.mrope_section) == t.head_dim // 2
        assert t.num_attention_heads % t.num_key_value_heads == 0
        assert np.isfinite(t.rope_theta) and 0 < t.rms_norm_eps < 1
    else:
        assert isinstance(out.error, CheckpointError)


@fuzz(400)
@given(data=st.data())
def test_config_json_byte_edits(ws, demo_dir, data):
    text = (demo_dir / "config.json").read_bytes()
    (ws / "config.json").write_bytes(mutate_bytes(text, data.draw))
    try:
        out = attempt(load_config, ws)
    finally:
        shutil.copy(demo_dir / "config.json", ws / "config.json")
    assert out.ok or isinstance(out.error, CheckpointError)
    assert out.ok or str(ws / "config.json") in str(out.error)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[" * 100_000,
        '{"model_type": "qwen3_vl", "text_config": ' + "[" * 100_000,
        "1" * 5000,
        '{"text_config": {"hidden_size": ' + "9" * 5000 + "}}",
        "\ufeff{}",
        "null",
        b"\xff\xfe{".decode("latin-1"),
    ],
    ids=["empty", "deep", "deep-inside", "long-int", "long-int-inside", "bom", "null", "utf16"],
)
def test_config_json_hostile_text(ws, demo_dir, text):
    (ws / "config.json").write_text(text, "latin-1" if "\xff" in text else "utf-8")
    try:
        with pytest.raises(CheckpointError, match="config.json"):
            load_config(ws)
    finally:
        shutil.copy(demo_dir / "config.json", ws / "config.json")


@fuzz(300)
@given(data=st.data())
def test_generation_config_edits(ws, demo_dir, data):
    raw = json.loads((demo_dir / "generation_config.json").read_text())
    if data.draw(st.booleans()):
        text = dumps(mutate_json(raw, data.draw))
    else:
        text = mutate_bytes(json.dumps(raw).encode(), data.draw).decode("utf-8", "replace")
    (ws / "generation_config.json").write_text(text, "utf-8", "surrogatepass")
    try:
        out = attempt(read_generation_defaults, ws, _tokenizer(demo_dir))
    finally:
        shutil.copy(demo_dir / "generation_config.json", ws / "generation_config.json")
    if out.ok:
        defaults = out.result
        assert defaults.eos_ids and all(isinstance(i, int) for i in defaults.eos_ids)
        vocab = _tokenizer(demo_dir).vocab_size
        assert all(0 <= i < vocab and not isinstance(i, bool) for i in defaults.eos_ids)
        defaults.sampling.validate()  # never an invalid default


@pytest.mark.parametrize("eos", [-1, [2, 999_999_999], True, [True]])
def test_generation_config_eos_outside_the_vocabulary(ws, demo_dir, eos):
    """An end-of-sequence id no token has (or a boolean) would let the model never stop."""
    raw = json.loads((demo_dir / "generation_config.json").read_text())
    (ws / "generation_config.json").write_text(json.dumps({**raw, "eos_token_id": eos}))
    try:
        with pytest.raises(CheckpointError, match="eos_token_id"):
            read_generation_defaults(ws, _tokenizer(demo_dir))
    finally:
        shutil.copy(demo_dir / "generation_config.json", ws / "generation_config.json")


@pytest.mark.parametrize("eos", [None, []])
def test_generation_config_without_eos_stops_on_the_chat_end_tokens(ws, demo_dir, eos):
    """No eos_token_id, null or an empty list (it had been "no end-of-sequence token is known"
    although the tokenizer has <|im_end|>): the chat template's end tokens."""
    raw = json.loads((demo_dir / "generation_config.json").read_text())
    (ws / "generation_config.json").write_text(json.dumps({**raw, "eos_token_id": eos}))
    tok = _tokenizer(demo_dir)
    try:
        defaults = read_generation_defaults(ws, tok)
    finally:
        shutil.copy(demo_dir / "generation_config.json", ws / "generation_config.json")
    assert defaults.eos_ids == {
        tok.special_tokens["<|im_end|>"],
        tok.special_tokens["<|endoftext|>"],
    }


_tokenizers = {}
HUB_MAX_PIXELS = 16_777_216  # Qwen3-VL's preprocessor longest_edge: the most Merlin allows


def _tokenizer(demo_dir):
    if demo_dir not in _tokenizers:
        _tokenizers[demo_dir] = Tokenizer.from_folder(demo_dir)
    return _tokenizers[demo_dir]


@fuzz(300)
@given(data=st.data())
def test_preprocessor_config_edits(ws, demo_dir, data):
    raw = json.loads((demo_dir / "preprocessor_config.json").read_text())
    if data.draw(st.booleans()):
        text = dumps(mutate_json(raw, data.draw))
    else:
        text = mutate_bytes(json.dumps(raw).encode(), data.draw).decode("utf-8", "replace")
    (ws / "preprocessor_config.json").write_text(text, "utf-8", "surrogatepass")
    try:
        out = attempt(load_preprocess_config, ws)
    finally:
        shutil.copy(demo_dir / "preprocessor_config.json", ws / "preprocessor_config.json")
    if out.ok:
        cfg = out.result
        assert isinstance(cfg, PreprocessConfig)
        # whatever the file says, no image is ever resized beyond the pixel limit
        assert PIXEL_LIMIT == HUB_MAX_PIXELS
        assert cfg.min_pixels <= cfg.max_pixels <= HUB_MAX_PIXELS
        assert cfg.factor**2 <= cfg.max_pixels
        for w, h in ((1, 1), (2, 2), (3000, 20), (20, 3000), (4000, 4000)):
            try:
                n = cfg.tokens_for(w, h)
            except ValueError:  # aspect ratio: prepare_pil refuses it with an InputError
                continue
            assert 0 < n * cfg.factor**2 <= max(HUB_MAX_PIXELS, 4 * cfg.factor**2)
    else:
        assert isinstance(out.error, CheckpointError)


@pytest.mark.parametrize(
    "edit",
    [
        {"min_pixels": 10**9, "max_pixels": 10**10},
        {"size": {"shortest_edge": 65536, "longest_edge": 2**40}},
        {"patch_size": 10**6},
        {"image_mean": [0.5, 0.5, 10**400]},
        {"rescale_factor": 10**400},
    ],
    ids=["gigapixel-min", "huge-max", "huge-patch", "huge-mean", "huge-rescale"],
)
def test_preprocessor_config_cannot_ask_for_gigapixels(ws, demo_dir, edit):
    raw = json.loads((demo_dir / "preprocessor_config.json").read_text())
    raw.update(edit)
    (ws / "preprocessor_config.json").write_text(json.dumps(raw))
    try:
        with pytest.raises(CheckpointError, match="preprocessor_config.json"):
            load_preprocess_config(ws)
    finally:
        shutil.copy(demo_dir / "preprocessor_config.json", ws / "preprocessor_config.json")
    with pytest.raises(InputError, match="too large"):
        PreprocessConfig().with_max_pixels(HUB_MAX_PIXELS + 1)


# ---- whole loads ---------------------------------------------------------------------------------


def _generate_two_tokens(model):
    ids = np.array([1, 2, 3])
    cache = model.new_cache(8)
    logits = model.text.forward(ids, text_positions(0, 3), cache)
    nxt = int(np.argmax(logits[-1]))
    model.text.forward(np.array([nxt]), text_positions(3, 1), cache)
    return cache.length


def _load_and_run(folder):
    """(model, None) after a 4-token run, or (model, the MerlinError the run ended in: e.g. a
    config whose context cannot hold 4 tokens)."""
    model = load_model(folder)
    try:
        assert _generate_two_tokens(model) == 4
    except MerlinError as e:
        return model, e
    return model, None


@fuzz(30)
@given(data=st.data())
def test_load_model_with_damaged_config(ws, demo_dir, demo_config, data):
    """Sizes that do not match the weights (layers, heads, dims, vocab, tie) are refused before
    any tensor is converted; a config that still matches gives a model that runs."""
    raw = mutate_json(demo_config, data.draw, n_max=2, focus=size_keys)
    (ws / "config.json").write_text(dumps(raw), "utf-8", "surrogatepass")
    try:
        with watchdog(), traced():
            out = attempt(_load_and_run, ws, trace_memory=True)
        if out.ok:
            estimate = estimate_memory(ws).total
    finally:
        shutil.copy(demo_dir / "config.json", ws / "config.json")
    if out.ok:  # the guard's estimate covers what loading and running took
        assert out.peak <= estimate, (out.peak, estimate)
        model, run_error = out.result
        assert run_error is None or isinstance(run_error, InputError), run_error
        assert run_error is None or model.max_context < 4
    else:
        # refused before converting: far less than the f32 weights (2x the bf16 file)
        assert out.peak <= (demo_dir / "model.safetensors").stat().st_size, out.peak
        assert isinstance(out.error, CheckpointError), out.error


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda c: c["text_config"].update(num_hidden_layers=10**12), "num_hidden_layers"),
        (lambda c: c["text_config"].update(num_hidden_layers=MAX_LAYERS), "no layer"),
        (lambda c: c["text_config"].update(num_hidden_layers=5), "no layer 4"),
        (lambda c: c["vision_config"].update(depth=10**9), "depth"),
        (lambda c: c["text_config"].update(vocab_size=10**15), "vocab_size|does not match"),
        (lambda c: c["text_config"].update(intermediate_size=2**40), "does not match"),
        (lambda c: c["text_config"].update(max_position_embeddings="8192"), "integer"),
        (lambda c: c["text_config"].update(max_position_embeddings=None), "integer"),
        (lambda c: c["text_config"].update(rope_theta=float("nan")), "rope_theta"),
        (lambda c: c["text_config"].update(rope_theta=float("inf")), "rope_theta"),
        (lambda c: c["vision_config"].update(patch_size="16"), "patch_size"),
        (lambda c: c.update(tie_word_embeddings="false"), "tie_word_embeddings"),
    ],
    ids=[
        "1e12-layers",
        "max-layers",
        "one-layer-too-many",
        "1e9-vision-blocks",
        "huge-vocab",
        "huge-mlp",
        "string-context",
        "null-context",
        "nan-theta",
        "inf-theta",
        "string-patch",
        "string-tie",
    ],
)
def test_damaged_config_fails_fast(ws, demo_dir, demo_config, edit, match):
    raw = json.loads(json.dumps(demo_config))
    edit(raw)
    (ws / "config.json").write_text(json.dumps(raw, allow_nan=True))
    try:
        with traced():
            out = attempt(load_model, ws, trace_memory=True)
    finally:
        shutil.copy(demo_dir / "config.json", ws / "config.json")
    assert out.error is not None, "loaded"
    assert isinstance(out.error, CheckpointError)
    assert re.search(match, str(out.error)), str(out.error)
    assert out.seconds < 5.0  # no loop over the claimed sizes (10**12 layers would never end)
    assert out.peak < 64 * 1024**2
