"""A random-weight Qwen3-30B-A3B-shaped checkpoint (Qwen3MoeForCausalLM layout) with the
real widths and a chosen number of layers, for the `moe` benchmark.

Why fewer layers: the 48-layer bf16 file is 61 GB, which does not fit this project's
machines' disk and memory at once; each layer is the same, so the benchmark measures L of
them and projects to 48 (engine.bench.moe). Real shapes (config.json of Qwen/Qwen3-30B-A3B):
hidden 2048, 32 query heads, 4 KV heads, head_dim 128, 128 experts, 8 per token,
moe_intermediate_size 768, norm_topk_prob true, vocab 151936, untied head. The tokenizer is
the demo's (2048 ids, within the vocab), the weights are written one tensor at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from platformdirs import user_cache_dir

from ..checkpoint import save_safetensors
from ..demo import random_tensor
from ..demo_tokenizer import write_demo_tokenizer

RECIPE_VERSION = 1
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
REAL_LAYERS = 48
# A few-MB checkpoint of the same architecture (every layer routed, norm_topk_prob true, as
# llama.cpp's qwen3moe computes it): the llama.cpp conversion check of `bench moe` and tests.
TINY = {
    **QWEN3_30B_A3B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 96,  # I, 2I != D: a square fused tensor has no layout to tell
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
}
SHAPES = {"30b-a3b": QWEN3_30B_A3B, "tiny": TINY}


def moe_config(layers: int, ids: dict[str, int], base: dict = QWEN3_30B_A3B) -> dict:
    return {
        **base,
        "num_hidden_layers": layers,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
    }


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    e, inter = cfg["num_experts"], cfg["moe_intermediate_size"]
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate.weight": (e, d),
        }
        for j in range(e):
            shapes |= {
                f"{p}mlp.experts.{j}.gate_proj.weight": (inter, d),
                f"{p}mlp.experts.{j}.up_proj.weight": (inter, d),
                f"{p}mlp.experts.{j}.down_proj.weight": (d, inter),
            }
    shapes["model.norm.weight"] = (d,)
    shapes["lm_head.weight"] = (cfg["vocab_size"], d)
    return shapes


def _build(folder: Path, layers: int, seed: int, base: dict = QWEN3_30B_A3B) -> None:
    write_demo_tokenizer(folder)
    added = json.loads((folder / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    ids = {t["content"]: int(i) for i, t in added.items()}
    cfg = moe_config(layers, ids, base)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}) + "\n"
    )
    rng = np.random.default_rng(seed)
    save_safetensors(
        folder / "model.safetensors",
        {n: (s, lambda n=n, s=s: random_tensor(n, s, rng)) for n, s in tensor_shapes(cfg).items()},
        dtype="BF16",
        metadata={"format": "pt"},
    )


def ensure_random_moe_checkpoint(
    layers: int = 4, root: Path | None = None, on_build=None, shape: str = "30b-a3b"
):
    """The checkpoint folder of SHAPES[shape], built on first use (aside, then renamed into
    place)."""
    base = SHAPES[shape]
    root = Path(root) if root else Path(user_cache_dir("merlin")) / "checkpoints"
    name = "qwen3-30b-a3b-random" if shape == "30b-a3b" else f"qwen3-moe-{shape}-random"
    folder = root / f"{name}-{layers}l-v{RECIPE_VERSION}"
    if (folder / "model.safetensors").is_file():
        return folder
    if on_build is not None:
        on_build()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        _build(tmp, layers, seed=30 + layers, base=base)
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
