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
