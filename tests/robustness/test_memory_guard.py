"""The memory guard: load_model estimates what the checkpoint needs in the chosen weights and
KV formats for the context budget (engine.memory) and refuses, before converting anything,
when it would not fit; the estimate agrees with what a loaded model really holds, and the
context budget bounds the KV cache."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from fuzzutil import traced

from merlin.engine import memory
from merlin.engine.config import parse_config
from merlin.engine.errors import CheckpointError, InputError, ResourceError
from merlin.engine.generate import AnswerOptions, generate
from merlin.engine.memory import estimate_for, estimate_memory
from merlin.engine.model import load_model
from merlin.engine.prompt import text_prompt
from merlin.engine.rope import text_positions
from merlin.engine.sampling import SamplingParams
from merlin.engine.vision.qweights import q8_linear
from merlin.engine.vision.stored import StoredWeight


def vision_bytes(model) -> int:
    enc = model.vision.encoder
    seen, total = set(), 0

    def walk(obj):
        nonlocal total
        if isinstance(obj, StoredWeight):  # left in the mapped file; its q8 copy is held
            total += q8_linear(obj, {}).nbytes  # (made at the first image: made here)
            return
        if isinstance(obj, np.ndarray):
            if id(obj) not in seen:
                seen.add(id(obj))
                total += obj.nbytes
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x)
        elif hasattr(obj, "__dict__"):
            for x in vars(obj).values():
                walk(x)

    walk(enc.w)
    return total


@pytest.mark.parametrize("weights,kv", [("f32", "f32"), ("q8", "q8"), ("q4", "f32")])
def test_estimate_matches_the_loaded_model(demo_dir, weights, kv):
    est = estimate_memory(demo_dir, weights, kv, context=512)
    model = load_model(demo_dir, weights=weights, kv=kv, context=512)
    w = model.text.w
    matrices = {id(m): m.nbytes for m in w.matrices()} | {id(w.embed): w.embed.nbytes}
    norms = sum(
        lw.input_norm.nbytes + lw.post_norm.nbytes + lw.q_norm.nbytes + lw.k_norm.nbytes
        for lw in w.layers
    )
    assert est.text_weights == sum(matrices.values()) + norms + w.norm.nbytes
    assert est.vision_weights == vision_bytes(model)
    cache = model.new_cache(512)
    cache.reserve(512)
    assert est.kv_cache == cache.nbytes
    assert est.kv_bytes_per_token == cache.bytes_per_token()


def test_estimate_covers_a_full_context_run(demo_dir):
    """Load + a prefill that fills the context budget + decoding: the peak of Python/NumPy
    allocations stays within the estimate."""
    context = 1024
    est = estimate_memory(demo_dir, "f32", "f32", context=context, image_pixels=0)
    with traced():
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        model = load_model(demo_dir, context=context)
        prompt = [int(i) for i in np.arange(context - 8) % 1000 + 10]
        options = AnswerOptions(SamplingParams(temperature=0.0), max_new_tokens=4, spec="off")
        prompt = text_prompt(prompt)
        list(generate(model, prompt, options, cache=model.new_cache(context), max_context=context))
        peak = tracemalloc.get_traced_memory()[1] - base
    assert peak <= est.total, (peak, est.describe())
    assert peak >= (est.total - est.margin) / 8  # and not wildly pessimistic


def test_guard_refuses_before_converting(demo_dir, monkeypatch):
    est = estimate_memory(demo_dir, "f32", "f32")
    monkeypatch.setattr(memory, "available_memory", lambda: est.total - 1)

    def no_conversion(*a, **k):
        raise AssertionError("weights converted although the model does not fit")

    monkeypatch.setattr("merlin.engine.model.load_text_weights", no_conversion)
    with traced():
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(ResourceError) as e:
            load_model(demo_dir)
        assert tracemalloc.get_traced_memory()[1] - base < 16 * 1024**2
    msg = str(e.value)
    assert demo_dir.name in msg and "available" in msg and "f32" in msg
    assert isinstance(e.value, InputError)  # the app shows it like any input problem


def test_guard_lets_a_fitting_model_load(demo_dir, monkeypatch):
    est = estimate_memory(demo_dir, "q8", "q8", context=2048)
    monkeypatch.setattr(memory, "available_memory", lambda: est.total)
    model = load_model(demo_dir, weights="q8", kv="q8", context=2048)
    assert model.weights_fmt == "q8"
    assert model.memory == est  # kept for the app to show


def test_guard_suggests_settings_that_fit(demo_dir, monkeypatch):
    big = estimate_memory(demo_dir, "f32", "f32", context=8192)
    small = estimate_memory(demo_dir, "f32", "q8", context=8192)
    assert small.total < big.total
    monkeypatch.setattr(memory, "available_memory", lambda: small.total)
    with pytest.raises(ResourceError, match="It would fit with a q8 KV cache"):
        load_model(demo_dir, context=8192)
    tiny = estimate_memory(demo_dir, "f32", "f32", context=2048)
    monkeypatch.setattr(memory, "available_memory", lambda: tiny.total)
    with pytest.raises(ResourceError, match="context budget of"):
        load_model(demo_dir, context=8192)


def test_unknown_available_memory_means_no_check(demo_dir, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: None)
    load_model(demo_dir)
    assert load_model(demo_dir, check_memory=False) is not None


def test_available_memory_sources(monkeypatch):
    monkeypatch.setenv(memory.ENV_AVAILABLE, "123456789")
    assert memory.available_memory() == 123456789
    monkeypatch.setenv(memory.ENV_AVAILABLE, "not a number")
    monkeypatch.setattr(memory, "_cgroup_available", lambda: None)
    found = memory.available_memory()  # falls back to /proc/meminfo
    assert found is None or found > 0
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 8 * 1024**3)
    monkeypatch.setattr(memory, "_cgroup_available", lambda: 2 * 1024**3)
    assert memory.available_memory() == 2 * 1024**3  # a container limit wins


def test_env_override_reaches_the_guard(demo_dir, monkeypatch):
    monkeypatch.setenv(memory.ENV_AVAILABLE, "1000000")
    with pytest.raises(ResourceError, match="only 1 MB"):
        load_model(demo_dir)


def test_context_budget_bounds_the_kv_cache(demo_model):
    est = estimate_for(demo_model.config, demo_model.folder, "f32", "f32", 300)
    cache = demo_model.new_cache(300)
    n = 0
    while True:
        try:
            demo_model.text.forward(np.arange(1, 65), text_positions(n, 64), cache)
        except InputError as e:
            assert "context" in str(e)
            break
        n += 64
    assert cache.length <= 300 and cache.capacity <= 300
    assert cache.nbytes <= est.kv_cache


def test_estimate_rejects_bad_arguments_and_folders(demo_dir, tmp_path):
    with pytest.raises(InputError, match="weights format"):
        estimate_memory(demo_dir, "q3")
    with pytest.raises(InputError, match="KV cache format"):
        estimate_memory(demo_dir, "f32", "q4")
    with pytest.raises(CheckpointError):
        estimate_memory(tmp_path)


def test_estimates_for_the_target_models():
    """Qwen3-VL-2B/8B shapes: the orders of magnitude people will see in the app."""
    two_b = {
        "model_type": "qwen3_vl",
        "tie_word_embeddings": True,
        "text_config": {
            "hidden_size": 2048,
            "num_hidden_layers": 28,
            "intermediate_size": 6144,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 262144,
            "rope_theta": 5000000,
            "rope_scaling": {"mrope_section": [24, 20, 20], "mrope_interleaved": True},
        },
        "vision_config": {
            "depth": 24,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "deepstack_visual_indexes": [5, 11, 17],
        },
    }
    cfg = parse_config(json.loads(json.dumps(two_b)), "config.json")
    e = {
        (w, kv): estimate_for(cfg, Path("/nonexistent"), w, kv, 8192, image_pixels=1 << 20)
        for w in ("f32", "q8", "q4")
        for kv in ("f32", "q8")
    }
    gib = 1024**3
    assert 6.0 * gib < e["f32", "f32"].text_weights < 7.0 * gib  # 1.7B parameters in f32
    assert e["q4", "q8"].text_weights < e["q8", "q8"].text_weights < 2.1 * gib
    assert e["q4", "q8"].kv_cache * 3.8 < e["q4", "f32"].kv_cache  # 132 vs 512 bytes per row
    assert e["q4", "q8"].total < 6 * gib  # fits a 8 GB board
    assert e["f32", "f32"].total > 8 * gib  # does not
    # the context budget bounds KV memory linearly
    half = estimate_for(cfg, Path("/nonexistent"), "q4", "q8", 4096, image_pixels=1 << 20)
    assert half.kv_cache * 2 == e["q4", "q8"].kv_cache


def test_cli_info_shows_the_estimates(demo_dir, capsys):
    from merlin.engine.cli import main

    assert main(["info", "--model", str(demo_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    mem = info["memory"]
    assert mem["context"] == 8192
    est = mem["estimates"]["q4 weights, q8 KV"]
    assert est["total"] == estimate_memory(demo_dir, "q4", "q8").total
    assert main(["info", "--model", str(demo_dir)]) == 0
    assert "f32 weights, f32 KV:" in capsys.readouterr().out


def test_cli_load_refusal_is_one_clear_line(demo_dir, monkeypatch, capsys):
    from merlin.engine.cli import main

    monkeypatch.setenv(memory.ENV_AVAILABLE, "1000000")
    code = main(["generate", "--model", str(demo_dir), "hello", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("merlin-cli: error:") and "only 1 MB" in err
    assert "Traceback" not in err
