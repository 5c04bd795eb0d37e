"""The peer benchmark's GGUF writer (bench/gguf_export.py) on the demo checkpoint, read back with
the gguf package's reader: llama.cpp's qwen3 names, shapes, metadata, tokenizer and the exact
tensor values."""

import json

import gguf  # the test extras (pyproject.toml); never imported by Merlin itself
import numpy as np
import pytest

from merlin.engine.bench import gguf_export
from merlin.engine.checkpoint import Checkpoint


def _field(reader, key):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else value[0]


def test_demo_checkpoint_round_trips(demo_dir, tmp_path):
    out = tmp_path / "demo.gguf"
    summary = gguf_export.export(demo_dir, out, "f32")
    reader = gguf.GGUFReader(str(out))
    config = json.loads((demo_dir / "config.json").read_text())
    text = config["text_config"]
    layers = text["num_hidden_layers"]
    assert _field(reader, "general.architecture") == "qwen3"
    assert _field(reader, "qwen3.block_count") == layers
    assert _field(reader, "qwen3.embedding_length") == text["hidden_size"]
    assert _field(reader, "qwen3.feed_forward_length") == text["intermediate_size"]
    assert _field(reader, "qwen3.attention.head_count") == text["num_attention_heads"]
    assert _field(reader, "qwen3.attention.head_count_kv") == text["num_key_value_heads"]
    assert _field(reader, "qwen3.attention.key_length") == text["head_dim"]
    assert _field(reader, "qwen3.rope.freq_base") == pytest.approx(text["rope_theta"])
    assert _field(reader, "qwen3.attention.layer_norm_rms_epsilon") == pytest.approx(
        text["rms_norm_eps"]
    )
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "qwen2"
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == text["vocab_size"]
    assert _field(reader, "tokenizer.ggml.eos_token_id") == text["eos_token_id"]

    tensors = {t.name: t for t in reader.tensors}
    assert summary["tensors"] == len(tensors)
    tied = config["tie_word_embeddings"]
    assert ("output.weight" in tensors) == (not tied)
    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                 "attn_k_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}  # fmt: skip
    expected = {f"blk.{i}.{n}.weight" for i in range(layers) for n in per_layer}
    expected |= {"token_embd.weight", "output_norm.weight"} | (set() if tied else {"output.weight"})
    assert set(tensors) == expected
    with Checkpoint(demo_dir) as ckpt:
        for ours, theirs in gguf_export.gguf_tensor_names(layers, tied).items():
            want = ckpt.read_f32(ours)
            got = np.asarray(tensors[theirs].data).reshape(want.shape)
            assert tensors[theirs].tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(got, want, err_msg=theirs)


def test_f16_matrices_and_f32_norms(demo_dir, tmp_path):
    out = tmp_path / "demo16.gguf"
    gguf_export.export(demo_dir, out, "f16")
    tensors = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["blk.0.attn_q_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


# --- Qwen3-MoE as llama.cpp's qwen3moe --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """A 2-layer random checkpoint of the qwen3_moe layout (engine.moe.random.TINY)."""
    from merlin.engine.moe.random import ensure_random_moe_checkpoint

    return ensure_random_moe_checkpoint(2, tmp_path_factory.mktemp("moe"), shape="tiny")


def _stacked(ckpt, prefix, i, part, n_experts):
    return np.stack(
        [
            ckpt.read_f32(f"{prefix}layers.{i}.mlp.experts.{e}.{part}.weight")
            for e in range(n_experts)
        ]
    )


def _tensors(path):
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _data(t):
    # GGUF lists dimensions innermost first; the NumPy view is in C order
    return np.asarray(t.data).reshape(tuple(int(n) for n in reversed(t.shape)))


def test_qwen3_moe_writes_qwen3moe(tiny_moe, tmp_path):
    out = tmp_path / "moe.gguf"
    summary = gguf_export.export(tiny_moe, out, "f32")
    cfg = json.loads((tiny_moe / "config.json").read_text())
    reader = gguf.GGUFReader(str(out))
    assert summary["arch"] == _field(reader, "general.architecture") == "qwen3moe"
    assert _field(reader, "qwen3moe.block_count") == 2
    assert _field(reader, "qwen3moe.expert_count") == cfg["num_experts"] == 8
    assert _field(reader, "qwen3moe.expert_used_count") == cfg["num_experts_per_tok"] == 2
    assert _field(reader, "qwen3moe.expert_feed_forward_length") == cfg["moe_intermediate_size"]
    assert _field(reader, "qwen3moe.embedding_length") == cfg["hidden_size"]
    assert _field(reader, "qwen3moe.attention.head_count") == cfg["num_attention_heads"]
    assert _field(reader, "qwen3moe.attention.head_count_kv") == cfg["num_key_value_heads"]
    assert _field(reader, "qwen3moe.attention.key_length") == cfg["head_dim"]
    assert _field(reader, "qwen3moe.attention.value_length") == cfg["head_dim"]
    assert _field(reader, "qwen3moe.rope.freq_base") == pytest.approx(cfg["rope_theta"])
    assert _field(reader, "qwen3moe.attention.layer_norm_rms_epsilon") == pytest.approx(
        cfg["rms_norm_eps"]
    )
    assert _field(reader, "tokenizer.ggml.eos_token_id") == cfg["eos_token_id"]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == cfg["vocab_size"]

    tensors = {t.name: t for t in reader.tensors}
    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                 "attn_k_norm", "ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                 "ffn_down_exps"}  # fmt: skip
    expected = {f"blk.{i}.{n}.weight" for i in range(2) for n in per_layer}
    assert set(tensors) == expected | {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert summary["tensors"] == len(tensors)
    e, inter, d = 8, cfg["moe_intermediate_size"], cfg["hidden_size"]
    # llama.cpp's create_tensor shapes (ne): gate/up {D, I, E}, down {I, D, E}, router {D, E}
    assert list(tensors["blk.0.ffn_gate_exps.weight"].shape) == [d, inter, e]
    assert list(tensors["blk.0.ffn_up_exps.weight"].shape) == [d, inter, e]
    assert list(tensors["blk.0.ffn_down_exps.weight"].shape) == [inter, d, e]
    assert list(tensors["blk.1.ffn_gate_inp.weight"].shape) == [d, e]
    with Checkpoint(tiny_moe) as ckpt:
        for i in range(2):
            p = f"blk.{i}."
            for gguf_name, part in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"),
                                    ("ffn_down_exps", "down_proj")):  # fmt: skip
                want = _stacked(ckpt, "model.", i, part, e)
                np.testing.assert_array_equal(_data(tensors[p + gguf_name + ".weight"]), want)
            router = ckpt.read_f32(f"model.layers.{i}.mlp.gate.weight")
            np.testing.assert_array_equal(_data(tensors[p + "ffn_gate_inp.weight"]), router)
            q = ckpt.read_f32(f"model.layers.{i}.self_attn.q_proj.weight")
            np.testing.assert_array_equal(_data(tensors[p + "attn_q.weight"]), q)
        np.testing.assert_array_equal(
            _data(tensors["output.weight"]), ckpt.read_f32("lm_head.weight")
        )
        np.testing.assert_array_equal(
            _data(tensors["token_embd.weight"]), ckpt.read_f32("model.embed_tokens.weight")
        )


def test_moe_f16_keeps_router_and_norms_f32(tiny_moe, tmp_path):
    out = tmp_path / "moe16.gguf"
    gguf_export.export(tiny_moe, out, "f16")
    tensors = _tensors(out)
    f16, f32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert tensors["blk.0.ffn_gate_exps.weight"].tensor_type == f16
    assert tensors["blk.0.ffn_down_exps.weight"].tensor_type == f16
    assert tensors["blk.0.attn_q.weight"].tensor_type == f16
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type == f32  # as llama.cpp keeps it
    assert tensors["blk.0.ffn_norm.weight"].tensor_type == f32


def _as_vl_moe(src, dst, transformers5: bool):
    """The tiny qwen3_moe checkpoint respelled as Qwen3VLMoeForConditionalGeneration's text
    part: text_config, model.language_model., fused experts (published [E, D, 2I] / [E, I, D],
    or transformers 5.x's [E, 2I, D] / [E, D, I]), sharded in two files with an index."""
    from merlin.engine.checkpoint import save_safetensors

    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    text = {**cfg, "model_type": "qwen3_vl_moe_text"}
    (dst / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
        "text_config": text, "tie_word_embeddings": False,
    }))  # fmt: skip
    e = cfg["num_experts"]
    tensors = {}
    with Checkpoint(src) as ckpt:
        for name in ckpt.tensors:
            if ".mlp.experts." in name:
                continue
            ours = "lm_head.weight" if name == "lm_head.weight" else name.replace(
                "model.", "model.language_model.", 1)  # fmt: skip
            tensors[ours] = ckpt.read_f32(name)
        for i in range(cfg["num_hidden_layers"]):
            gate, up, down = (_stacked(ckpt, "model.", i, p, e)
                              for p in ("gate_proj", "up_proj", "down_proj"))  # fmt: skip
            gate_up = np.concatenate([gate, up], axis=1)  # [E, 2I, D]
            p = f"model.language_model.layers.{i}.mlp.experts."
            if transformers5:
                tensors[p + "gate_up_proj"], tensors[p + "down_proj"] = gate_up, down
            else:
                tensors[p + "gate_up_proj"] = gate_up.transpose(0, 2, 1).copy()
                tensors[p + "down_proj"] = down.transpose(0, 2, 1).copy()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    for file, part in halves.items():
        save_safetensors(dst / file, {n: tensors[n] for n in part}, dtype="F32")
    weight_map = {n: f for f, part in halves.items() for n in part}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("transformers5", [False, True])
def test_vl_moe_text_part_writes_the_same_gguf(tiny_moe, tmp_path, transformers5):
    vl = tmp_path / "vl"
    _as_vl_moe(tiny_moe, vl, transformers5)
    gguf_export.export(tiny_moe, tmp_path / "text.gguf", "f32")
    summary = gguf_export.export(vl, tmp_path / "vl.gguf", "f32")
    assert summary["arch"] == "qwen3moe"
    a, b = _tensors(tmp_path / "text.gguf"), _tensors(tmp_path / "vl.gguf")
    assert set(a) == set(b)
    for name in a:
        assert list(a[name].shape) == list(b[name].shape), name
        np.testing.assert_array_equal(_data(a[name]), _data(b[name]), err_msg=name)


def test_what_qwen3moe_cannot_express_is_refused(tmp_path):
    from support import FIXTURES

    # decoder_sparse_step 2: dense layers between the routed ones
    with pytest.raises(ValueError, match="dense layers"):
        gguf_export.export(FIXTURES / "moe_text_sharded", tmp_path / "a.gguf")
    # mlp_only_layers [1]
    with pytest.raises(ValueError, match="dense layers"):
        gguf_export.export(FIXTURES / "moe_vl_bf16", tmp_path / "b.gguf")
    cfg = json.loads((FIXTURES / "moe_text_sharded" / "config.json").read_text())
    cfg |= {"decoder_sparse_step": 1, "norm_topk_prob": False}
    with pytest.raises(ValueError, match="renormalises"):
        gguf_export.moe_settings(cfg)
    assert not (tmp_path / "a.gguf").exists() and not (tmp_path / "b.gguf").exists()


def test_missing_expert_tensor_is_named(tiny_moe, tmp_path):
    vl = tmp_path / "vl"
    _as_vl_moe(tiny_moe, vl, False)
    index = json.loads((vl / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.language_model.layers.1.mlp.experts.down_proj"]
    (vl / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.down_proj"):
        gguf_export.export(vl, tmp_path / "x.gguf")
