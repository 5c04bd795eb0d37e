"""Mixture-of-experts models (Qwen3-VL-30B-A3B's and Qwen3-30B-A3B's layout) against
transformers on the moe_* fixtures (tests/make_reference.py): configs in both spellings,
f32 logits and greedy tokens, an image prompt, the router's decisions exactly; quantized
experts; rows of an N-row forward bitwise equal to 1-row forwards; the weight cache; bad
input."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from support import FIXTURES, load_text_model

from merlin.engine.checkpoint import Checkpoint
from merlin.engine.config import load_config
from merlin.engine.errors import CheckpointError
from merlin.engine.kernels.experts import group_by_expert, route, route_reference
from merlin.engine.rope import mrope_positions, text_positions
from merlin.engine.text import TextModel, check_text_tensors, load_text_weights

VL = FIXTURES / "moe_vl_bf16"
TEXT = FIXTURES / "moe_text_sharded"
MOE_DIRS = [VL, TEXT]
IMAGES = FIXTURES / "vision_images"


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(params=MOE_DIRS, ids=lambda p: p.name, scope="module")
def case(request):
    ref = np.load(request.param / "reference.npz")
    return load_text_model(request.param), ref


def load_model_fmt(folder, fmt):
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt:
        return TextModel(cfg.text, load_text_weights(ckpt, cfg, fmt))


# ---- configs ---------------------------------------------------------------------------------


def test_configs_in_both_layouts():
    vl, text = load_config(VL), load_config(TEXT)
    assert vl.model_type == "qwen3_vl_moe" and vl.vision is not None
    assert vl.text_prefix == "model.language_model."
    m = vl.text.moe
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (8, 3, 96)
    assert m.norm_topk_prob and vl.text.rope_theta == 5e6  # 4.57 rope spelling
    assert [vl.text.is_moe_layer(i) for i in range(3)] == [True, False, True]
    assert text.model_type == "qwen3_moe" and text.vision is None
    assert text.text_prefix == "model."
    m = text.text.moe
    assert (m.num_experts, m.experts_per_token, m.norm_topk_prob) == (6, 4, False)
    assert [text.text.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert text.text.rope_theta == 1e6
    assert text.text.n_active_params < text.text.n_params
    assert "6 experts x 32, 4 per token" in text.describe()


def test_num_local_experts_spelling(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(TEXT, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["num_local_experts"] = raw.pop("num_experts")
    (folder / "config.json").write_text(json.dumps(raw))
    assert load_config(folder).text.moe.num_experts == 6


# ---- f32 against transformers ------------------------------------------------------------------


def test_prompt_logits_and_routing_match_transformers(case):
    model, ref = case
    ids = ref["input_ids"]
    seen = {}
    model.on_routing = lambda li, idx, w: seen.__setitem__(li, (idx.copy(), w.copy()))
    try:
        logits = model.forward(ids, text_positions(0, len(ids)), model.new_cache(256), logits="all")
    finally:
        model.on_routing = None
    for pos in range(len(ids)):
        assert rel_err(logits[pos], ref["logits"][pos]) < 1e-4, f"position {pos}"
    layers = sorted(seen)
    assert len(layers) == len(ref["router_indices"])
    idx = np.stack([seen[li][0] for li in layers])
    np.testing.assert_array_equal(idx, ref["router_indices"])  # the same experts, same order
    w = np.stack([seen[li][1] for li in layers])
    np.testing.assert_allclose(w, ref["router_weights"], rtol=0, atol=1e-5)


def test_greedy_tokens_match_transformers(case):
    model, ref = case
    ids = ref["input_ids"]
    cache = model.new_cache(256)
    logits = model.forward(ids, text_positions(0, len(ids)), cache)
    out = []
    for _ in range(len(ref["greedy_ids"])):
        token = int(np.argmax(logits[-1]))
        out.append(token)
        logits = model.forward(np.array([token]), text_positions(cache.length, 1), cache)
    assert out == ref["greedy_ids"].tolist()


def test_image_prompts_match_transformers():
    from merlin.engine.vision import load_vision

    cfg = load_config(VL)
    with Checkpoint(VL) as ckpt:
        text = TextModel(cfg.text, load_text_weights(ckpt, cfg))
        vision = load_vision(VL, ckpt, cfg)
    table = json.loads((IMAGES / "images.json").read_text())["images"]
    ref_all = np.load(VL / "vision_reference.npz")
    n_prompts = len([k for k in ref_all.files if k.endswith("_input_ids")])
    assert n_prompts == 2
    for k in range(n_prompts):
        ref = {key[3:]: ref_all[key] for key in ref_all.files if key.startswith(f"p{k}_")}
        images = [vision.prepare(IMAGES / table[str(m)]["file"]) for m in ref["images"]]
        ids = ref["input_ids"]
        pos, delta = mrope_positions(ids, cfg.image_token_id, [im.grid_thw for im in images], 2)
        np.testing.assert_array_equal(pos, ref["position_ids"])
        inputs = vision.prompt_inputs(ids, images)
        cache = text.new_cache(256)
        logits = text.forward(
            ids,
            pos,
            cache,
            embeds=inputs.embeds,
            embed_rows=inputs.rows,
            deepstack=inputs.deepstack,
            logits="all",
        )
        for i in range(len(ids)):
            assert rel_err(logits[i], ref["logits"][i]) < 1e-4, f"prompt {k} position {i}"
        out = []
        for _ in range(len(ref["greedy_ids"])):
            token = int(np.argmax(logits[-1]))
            out.append(token)
            logits = text.forward(np.array([token]), text_positions(cache.length, 1, delta), cache)
        assert out == ref["greedy_ids"].tolist(), f"prompt {k}"


# ---- the router and the grouping ---------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
def test_route_matches_reference(normalize):
    rng = np.random.default_rng(5)
    logits = (3 * rng.standard_normal((40, 128))).astype(np.float32)
    idx = np.empty((40, 8), np.int64)
    w = np.empty((40, 8), np.float32)
    route(logits, 8, normalize, idx, w)
    ref_idx, ref_w = route_reference(logits, 8, normalize)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(w, ref_w, rtol=2e-6, atol=1e-7)
    assert np.all(np.diff(w, axis=1) <= 0)
    if normalize:
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)


def test_route_ties_go_to_the_lower_expert():
    logits = np.zeros((1, 6), np.float32)
    logits[0, [1, 4]] = 2.0
    idx = np.empty((1, 3), np.int64)
    w = np.empty((1, 3), np.float32)
    route(logits, 3, True, idx, w)
    assert idx[0].tolist() == [1, 4, 0]


def test_group_by_expert_lists_every_pair_once_in_row_order():
    rng = np.random.default_rng(1)
    idx = np.stack([rng.permutation(10)[:3] for _ in range(7)]).astype(np.int64)
    starts = np.empty(11, np.int64)
    pairs = np.empty((21, 2), np.int64)
    used = group_by_expert(idx, 10, starts, pairs)
    assert used == len(np.unique(idx))
    for e in range(10):
        rows = pairs[starts[e] : starts[e + 1]]
        assert all(idx[n, s] == e for n, s in rows)
        assert list(rows[:, 0]) == sorted(rows[:, 0])
    assert starts[-1] == 21


# ---- quantized experts and the bitwise contract ----------------------------------------------


@pytest.mark.parametrize("fmt,min_agree", [("q8", 0.85), ("q4", 0.5)])
@pytest.mark.parametrize("folder", MOE_DIRS, ids=lambda p: p.name)
def test_quantized_experts_agree_with_f32(folder, fmt, min_agree):
    model = load_model_fmt(folder, fmt)
    assert all(ew.kind in (fmt, "q8r") for ew in model.w.experts())
    ref = np.load(folder / "reference.npz")
    seq = np.concatenate([ref["input_ids"], ref["greedy_ids"]])
    logits = model.forward(seq, text_positions(0, len(seq)), model.new_cache(256), logits="all")
    n0 = len(ref["input_ids"])
    picks = logits[n0 - 1 : -1].argmax(-1)
    agree = float(np.mean(picks == ref["greedy_ids"]))
    assert agree >= min_agree, agree
    assert rel_err(logits[:n0], ref["logits"]) < (0.1 if fmt == "q8" else 0.3)


@pytest.mark.parametrize("fmt", ["f32", "q8", "q4"])
@pytest.mark.parametrize("folder", MOE_DIRS, ids=lambda p: p.name)
def test_rows_of_a_forward_equal_one_row_forwards(folder, fmt):
    """Verify (N = 5), a longer forward (N = 12) and, quantized, a whole prompt: every row
    equals the 1-row forward at its position bit for bit (the routed layers group the rows
    by expert; each row's experts and sums must not depend on the others)."""
    model = load_model_fmt(folder, fmt)
    ids = np.load(folder / "reference.npz")["input_ids"]
    # f32 dense matrices take BLAS above linear.SMALL_N rows (not bitwise); the routed
    # layers and every quantized matrix are bitwise at any N
    sizes = (5, 12) if fmt == "f32" else (5, 12, len(ids) - 2)
    for k in sizes:
        n0 = len(ids) - k
        cache = model.new_cache(128)
        model.forward(ids[:n0], text_positions(0, n0), cache, logits="none")
        batch = model.forward(ids[n0:], text_positions(n0, k), cache, logits="all")
        cache.truncate(n0)
        for i in range(k):
            row = model.forward(ids[n0 + i : n0 + i + 1], text_positions(n0 + i, 1), cache)
            assert np.array_equal(row[0], batch[i]), f"N={k}: row {i} differs"


def test_rows_do_not_depend_on_the_thread_count():
    import numba

    model = load_model_fmt(VL, "q4")
    ids = np.load(VL / "reference.npz")["input_ids"]
    before = numba.get_num_threads()
    outs = []
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            cache = model.new_cache(64)
            outs.append(model.forward(ids, text_positions(0, len(ids)), cache, logits="all"))
    finally:
        numba.set_num_threads(before)
    assert all(np.array_equal(outs[0], o) for o in outs)


def test_decode_reads_only_the_selected_experts():
    model = load_model_fmt(TEXT, "q4")
    ids = np.load(TEXT / "reference.npz")["input_ids"]
    cache = model.new_cache(64)
    model.forward(ids, text_positions(0, len(ids)), cache)
    routed = model.w.experts()
    assert model.experts_read <= sum(ew.num_experts for ew in routed)
    model.forward(ids[:1], text_positions(cache.length, 1), cache)
    assert model.experts_read == sum(ew.experts_per_token for ew in routed)
    dense = sum(m.nbytes for m in model.w.matrices())
    per_expert = routed[0].expert_bytes
    assert model.w.bytes_per_token < dense + sum(ew.nbytes for ew in routed)
    assert model.w.bytes_per_token >= dense - model.w.embed.nbytes + 4 * 2 * per_expert


# ---- the weight cache ----------------------------------------------------------------------------


def test_weight_cache_roundtrip(tmp_path, monkeypatch):
    from merlin.engine import weight_cache

    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "cache"))
    cfg = load_config(VL)
    with Checkpoint(VL) as ckpt:
        w = load_text_weights(ckpt, cfg, "q4")
        key = weight_cache.cache_key(ckpt, cfg, "q4")
    weight_cache.store(key, w)
    again = weight_cache.load(key, cfg)
    assert again is not None
    ids = np.load(VL / "reference.npz")["input_ids"]
    outs = []
    for weights in (w, again):
        model = TextModel(cfg.text, weights)
        outs.append(model.forward(ids, text_positions(0, len(ids)), model.new_cache(64)))
    assert np.array_equal(*outs)


# ---- bad input ---------------------------------------------------------------------------------


def _copy(src, tmp_path):
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    return folder


def test_more_experts_per_token_than_experts(tmp_path):
    folder = _copy(TEXT, tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    raw["num_experts_per_tok"] = 7
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="num_experts_per_tok' \\(7\\) is larger"):
        load_config(folder)


def test_missing_expert_tensor_is_named(tmp_path):
    from merlin.engine.checkpoint import save_safetensors

    folder = _copy(TEXT, tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = "model.layers.3.mlp.experts.5.up_proj.weight"
    shard = folder / index["weight_map"].pop(name)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with Checkpoint(folder) as ckpt:  # rewrite the shard without it
        tensors = {n: np.array(ckpt.raw(n)) for n, i in ckpt.tensors.items() if i.file == shard}
        dtypes = {n: ckpt.info(n).dtype for n in tensors}
    del tensors[name]
    assert set(dtypes.values()) == {"BF16"}
    save_safetensors(shard, tensors, dtype=None)
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt, pytest.raises(CheckpointError, match=name):
        check_text_tensors(ckpt, cfg)


def test_missing_fused_expert_tensor_is_named(tmp_path):
    from merlin.engine.checkpoint import save_safetensors

    folder = _copy(VL, tmp_path)
    name = "model.language_model.layers.2.mlp.experts.down_proj"
    with Checkpoint(folder) as ckpt:
        tensors = {n: np.array(ckpt.raw(n)) for n in ckpt.tensors if n != name}
    save_safetensors(folder / "model.safetensors", tensors, dtype=None)
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt, pytest.raises(CheckpointError, match=name):
        check_text_tensors(ckpt, cfg)


def test_index_naming_a_tensor_twice_or_a_shard_not_at_all(tmp_path):
    folder = _copy(TEXT, tmp_path)
    path = folder / "model.safetensors.index.json"
    text = path.read_text()
    index = json.loads(text)
    name, shard = next(iter(index["weight_map"].items()))
    # the same tensor listed twice, for two different shards
    other = next(f for f in index["weight_map"].values() if f != shard)
    twice = text.replace('"weight_map": {', f'"weight_map": {{\n    "{name}": "{other}",', 1)
    path.write_text(twice)
    with pytest.raises(CheckpointError, match=name):
        Checkpoint(folder)
    # a shard the index never names: its tensors are missing, by name
    dropped = sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != dropped}
    path.write_text(json.dumps(index))
    cfg = load_config(folder)
    with pytest.raises(CheckpointError, match=dropped):
        Checkpoint(folder)
    del cfg


# ---- memory-mapped experts and the memory guard ----------------------------------------------


@pytest.fixture
def text_folder(tmp_path, monkeypatch):
    """moe_text_sharded with the demo tokenizer (load_model needs one), its own weight cache."""
    from merlin.engine.demo_tokenizer import write_demo_tokenizer

    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "cache"))
    folder = _copy(TEXT, tmp_path)
    write_demo_tokenizer(folder)
    return folder


def _prompt_logits(model):
    ids = np.load(TEXT / "reference.npz")["input_ids"]
    return model.text.forward(ids, text_positions(0, len(ids)), model.new_cache(64), logits="all")


def test_experts_mapped_from_the_weight_cache(text_folder, tmp_path):
    from merlin.engine.model import load_model

    plain = load_model(text_folder, weights="q4", map_experts=False)
    assert not plain.experts_mapped
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len([f for f in files if "-L" in f]) == 2  # one file per routed layer
    for first in (True, False):  # from the files written above, then a first load mapped
        if not first:
            for p in (tmp_path / "cache").iterdir():
                p.unlink()
        mapped = load_model(text_folder, weights="q4", map_experts=True)
        assert mapped.experts_mapped and mapped.memory.mapped_experts > 0
        for ew in mapped.text.w.experts():
            for a in (*ew.gate_up.arrays.values(), *ew.down.arrays.values()):
                assert not a.flags.owndata and not a.flags.writeable
        assert np.array_equal(_prompt_logits(mapped), _prompt_logits(plain))


def test_a_cache_disk_without_room_converts_in_memory(text_folder, tmp_path, monkeypatch, caplog):
    """Too little free space for the converted weights: nothing is written (a conversion had
    filled the disk with layer files, every start), the model runs from memory, the log says
    what to do; experts that must be mapped from the cache are refused with the reason."""
    import logging

    from merlin.engine import weight_cache
    from merlin.engine.errors import InputError, ResourceError
    from merlin.engine.model import load_model

    monkeypatch.setattr(weight_cache, "free_bytes", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="merlin.engine.weight_cache"):
        model = load_model(text_folder, weights="q4", map_experts=False)
    assert (
        "converted in memory at every start" in caplog.text and "MERLIN_WEIGHT_CACHE" in caplog.text
    )
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(cache.iterdir())
    assert np.isfinite(_prompt_logits(model)).all()
    with pytest.raises(ResourceError, match="MERLIN_WEIGHT_CACHE"):
        load_model(text_folder, weights="q4", map_experts=True)
    with pytest.raises(InputError, match="q4 or q8"):  # f32 is never cached: it was ignored
        load_model(text_folder, weights="f32", map_experts=True)


def test_memory_guard_maps_experts_only_when_needed(text_folder, monkeypatch):
    from merlin.engine import memory
    from merlin.engine.errors import ResourceError
    from merlin.engine.model import load_model

    cfg = load_config(text_folder)
    in_ram = memory.estimate_for(cfg, text_folder, "q4", "f32", None, vision_usable=False)
    mapped = memory.estimate_for(
        cfg, text_folder, "q4", "f32", None, vision_usable=False, map_experts=True
    )
    assert mapped.total < in_ram.total and mapped.mapped_experts > 0
    monkeypatch.setenv(memory.ENV_AVAILABLE, str(in_ram.total))
    assert not load_model(text_folder, weights="q4", kv="f32").experts_mapped
    monkeypatch.setenv(memory.ENV_AVAILABLE, str(in_ram.total - 1))
    model = load_model(text_folder, weights="q4", kv="f32")
    assert model.experts_mapped
    monkeypatch.setenv(memory.ENV_AVAILABLE, str(mapped.total - 1))
    with pytest.raises(ResourceError, match="memory-mapped from the weight cache"):
        load_model(text_folder, weights="q4", kv="f32")
    with pytest.raises(ResourceError):  # never mapped: refused at the in-memory size
        load_model(text_folder, weights="q4", kv="f32", map_experts=False)


def test_eviction_removes_a_model_with_its_layer_files(tmp_path):
    from merlin.engine import weight_cache

    folder = tmp_path / "c"
    folder.mkdir()
    old, new = "0" * 24, "f" * 24  # cache keys (weight_cache.cache_key)
    for key, age in ((old, 100), (new, 0)):
        for name in (f"{key}.safetensors", f"{key}-L1.safetensors", f"{key}-L3.safetensors"):
            p = folder / name
            p.write_bytes(b"x" * 1000)
            t = 1_000_000 - age
            os.utime(p, (t, t))
    weight_cache.evict(folder, 3500, keep=folder / f"{new}.safetensors")
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{new}-L1.safetensors",
        f"{new}-L3.safetensors",
        f"{new}.safetensors",
    ]


# ---- the CLI -------------------------------------------------------------------------------------


def test_cli_info_and_profile(text_folder, capsys):
    from merlin.engine.cli import main

    assert main(["info", "--model", str(text_folder), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    moe = info["moe"]
    assert moe["experts"] == 6 and moe["experts_per_token"] == 4 and moe["routed_layers"] == 2
    assert moe["params_decoder_active"] < moe["params_decoder_total"]
    assert (
        info["weight_bytes_per_token"]["q4"]
        < info["memory"]["estimates"]["q4 weights, f32 KV"]["text_weights"]
    )
    assert main(["info", "--model", str(text_folder)]) == 0
    assert "4 per token" in capsys.readouterr().out
    args = ["generate", "--model", str(text_folder), "--weights", "q4", "--profile"]
    args += ["--map-experts", "yes", "--temperature", "0", "--max-new-tokens", "3", "hello"]
    args += ["--ignore-eos"]
    assert main(args) == 0
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if line.startswith("step")]
    assert steps and all("experts " in line for line in steps)
    assert any("experts 8 " in line for line in steps[1:])  # a decode step: 2 layers x 4


# ---- generation: speculative decoding and sessions treat MoE like dense ---------------------


@pytest.mark.parametrize("weights", ["f32", "q4"])
def test_speculative_greedy_output_is_byte_identical(text_folder, weights):
    from merlin.engine.generate import AnswerOptions, generate
    from merlin.engine.model import load_model
    from merlin.engine.prompt import chat_prompt_ids
    from merlin.engine.sampling import SamplingParams
    from merlin.engine.speculative import Drafter

    model = load_model(text_folder, weights=weights, kv="q8")
    from merlin.engine.prompt import text_prompt

    prompt = chat_prompt_ids(model.tokenizer, "Tell me about experts.")

    def run(spec, drafter=None):
        options = AnswerOptions(
            sampling=SamplingParams(temperature=0.0),
            max_new_tokens=20,
            ignore_eos=True,
            spec=spec,
            spec_k=4,
        )
        return list(generate(model, text_prompt(prompt), options, drafter=drafter))[-1].totals

    plain = run("off")
    answer = plain["token_ids"]
    drafter = Drafter(exclude={model.config.image_token_id})
    drafter.extend(prompt + list(answer) + [0, 0] + prompt)  # a regenerate: drafts that hit
    spec = run("on", drafter)
    assert spec["token_ids"] == answer
    assert spec["spec"]["hits"] > 0


def test_panel_stats_carry_experts_and_bytes():
    from merlin.app.model.perf_stats import PerfStats
    from merlin.engine.profile import StepProfile

    stats = PerfStats()
    stats.tokens_event([1], StepProfile(n_tokens=1, experts_read=384, weight_bytes=7), 0.0)
    assert (stats.experts_read, stats.weight_bytes) == (384, 7)
