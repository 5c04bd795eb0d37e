"""The demo checkpoints: the shipped trained one, and random-weight ones built on first use.

`ensure_demo_checkpoint()` is the default model when the user has none: the tiny Qwen3-VL
trained by the project on pictures of shapes that ships in the package
(engine.demo_model; resources/demo-model). The random-weight builders below make checkpoints
in the real folder layout (config in the published 4.57 spelling, bf16 safetensors, a
tokenizer trained by the project with all Qwen special tokens, a ChatML template that handles
images) that go through the same loading code as a downloaded checkpoint; their answers are
random text. QWEN3VL_2B (the exact 2B shapes) is what the speed benchmarks measure; DEMO (a
small random one) is what most tests run on: it is built in a second and its flat random
logits never stop early, so tests can ask for N tokens and get N.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from platformdirs import user_cache_dir

from .checkpoint import save_safetensors
from .demo_tokenizer import DEMO_VOCAB_SIZE, write_demo_tokenizer

DEMO_SEED = 1234

# Shapes small enough to build in a second and run at interactive speed in tests, with the
# real structure: GQA 2:1, head_dim 64 with the 2B's MRoPE section ratios, a ViT with
# DeepStack. The lm_head is untied: with a tied random head the argmax echoes the input
# token, and the demo would answer with one token over and over.
DEMO_TEXT = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": DEMO_VOCAB_SIZE,
    "max_position_embeddings": 8192,
    "rope_theta": 5000000,
    "rope_scaling": {
        "rope_type": "default",
        "mrope_section": [12, 10, 10],
        "mrope_interleaved": True,
    },
}
DEMO_VISION = {
    "depth": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_heads": 4,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "out_hidden_size": 256,
    "num_position_embeddings": 256,
    "deepstack_visual_indexes": [0, 1],
}


def qwen3vl_config(
    text: dict, vision: dict, tokenizer_ids: dict[str, int], tie: bool = True
) -> dict:
    """A config.json in the published (transformers 4.57) spelling."""
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": tokenizer_ids["<|image_pad|>"],
        "video_token_id": tokenizer_ids["<|video_pad|>"],
        "vision_start_token_id": tokenizer_ids["<|vision_start|>"],
        "vision_end_token_id": tokenizer_ids["<|vision_end|>"],
        "tie_word_embeddings": tie,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": 1e-6,
            "bos_token_id": tokenizer_ids["<|endoftext|>"],
            "eos_token_id": tokenizer_ids["<|im_end|>"],
            "tie_word_embeddings": tie,
            "dtype": "bfloat16",
            **text,
        },
        "vision_config": {"model_type": "qwen3_vl", "hidden_act": "gelu_pytorch_tanh", **vision},
        "dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0",
    }


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3-VL checkpoint with its shape, in the published order."""
    t, v = config["text_config"], config["vision_config"]
    d, hd = t["hidden_size"], t["head_dim"]
    q, kv, i = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd, t["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {}
    p = "model.language_model."
    shapes[p + "embed_tokens.weight"] = (t["vocab_size"], d)
    for n in range(t["num_hidden_layers"]):
        lp = f"{p}layers.{n}."
        shapes.update(
            {
                lp + "input_layernorm.weight": (d,),
                lp + "self_attn.q_proj.weight": (q, d),
                lp + "self_attn.k_proj.weight": (kv, d),
                lp + "self_attn.v_proj.weight": (kv, d),
                lp + "self_attn.o_proj.weight": (d, q),
                lp + "self_attn.q_norm.weight": (hd,),
                lp + "self_attn.k_norm.weight": (hd,),
                lp + "post_attention_layernorm.weight": (d,),
                lp + "mlp.gate_proj.weight": (i, d),
                lp + "mlp.up_proj.weight": (i, d),
                lp + "mlp.down_proj.weight": (d, i),
            }
        )
    shapes[p + "norm.weight"] = (d,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (t["vocab_size"], d)
    vd, vi, out = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    ps, tp, ch = v["patch_size"], v["temporal_patch_size"], v["in_channels"]
    m = vd * v["spatial_merge_size"] ** 2
    vp = "model.visual."
    shapes[vp + "patch_embed.proj.weight"] = (vd, ch, tp, ps, ps)
    shapes[vp + "patch_embed.proj.bias"] = (vd,)
    shapes[vp + "pos_embed.weight"] = (v["num_position_embeddings"], vd)
    for n in range(v["depth"]):
        bp = f"{vp}blocks.{n}."
        for norm in ("norm1", "norm2"):
            shapes[bp + norm + ".weight"] = (vd,)
            shapes[bp + norm + ".bias"] = (vd,)
        shapes.update(
            {
                bp + "attn.qkv.weight": (3 * vd, vd),
                bp + "attn.qkv.bias": (3 * vd,),
                bp + "attn.proj.weight": (vd, vd),
                bp + "attn.proj.bias": (vd,),
                bp + "mlp.linear_fc1.weight": (vi, vd),
                bp + "mlp.linear_fc1.bias": (vi,),
                bp + "mlp.linear_fc2.weight": (vd, vi),
                bp + "mlp.linear_fc2.bias": (vd,),
            }
        )
    mergers = [vp + "merger."] + [
        f"{vp}deepstack_merger_list.{k}." for k in range(len(v["deepstack_visual_indexes"]))
    ]
    for k, mp in enumerate(mergers):
        norm_dim = vd if k == 0 else m  # the main merger normalises before the 2x2 shuffle
        shapes.update(
            {
                mp + "norm.weight": (norm_dim,),
                mp + "norm.bias": (norm_dim,),
                mp + "linear_fc1.weight": (m, m),
                mp + "linear_fc1.bias": (m,),
                mp + "linear_fc2.weight": (out, m),
                mp + "linear_fc2.bias": (out,),
            }
        )
    return shapes


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Weights with a spread that keeps activations O(1): matrices ~ N(0, 1/fan_in), norm
    weights near 1, biases small."""
    if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    if name.endswith("embed_tokens.weight") or name.endswith("pos_embed.weight"):
        fan_in = 1
    return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)


def write_random_checkpoint(folder: Path, config: dict, seed: int, dtype: str = "BF16") -> None:
    """config.json + model.safetensors with seeded random weights, one tensor at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(config)
    save_safetensors(
        folder / "model.safetensors",
        {
            name: (shape, lambda n=name, s=shape: random_tensor(n, s, rng))
            for name, shape in shapes.items()
        },
        dtype=dtype,
        metadata={"format": "pt"},
    )


PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


@dataclass(frozen=True)
class RandomModelSpec:
    """A random-weight checkpoint: what it is called, its shapes, and the seed."""

    name: str
    text: dict
    vision: dict
    tie: bool
    seed: int


DEMO = RandomModelSpec("qwen3vl-demo", DEMO_TEXT, DEMO_VISION, tie=False, seed=DEMO_SEED)

# The exact Qwen3-VL-2B-Instruct shapes (spec section 1.1): what the benchmark measures and what
# the app can load to show real-size figures without downloaded weights.
QWEN3VL_2B = RandomModelSpec(
    "qwen3vl-2b-random",
    text={
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "rope_theta": 5000000,
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": [24, 20, 20],
            "mrope_interleaved": True,
        },
    },
    vision={
        "depth": 24,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_heads": 16,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "in_channels": 3,
        "out_hidden_size": 2048,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [5, 11, 17],
    },
    tie=True,
    seed=2,
)

# Qwen3-VL-8B's vision encoder (depth 27, width 1152, an MLP of 4,304: not a multiple of 32)
# in front of a one-layer text model of the 8B's width: what `python -m
# merlin.engine.bench.vision_ttft --shape 8b` encodes (its time to first token is not the 8B's).
QWEN3VL_8B_VISION = RandomModelSpec(
    "qwen3vl-8b-vision-random",
    text={**QWEN3VL_2B.text, "hidden_size": 4096, "num_hidden_layers": 1,
          "intermediate_size": 12288, "num_attention_heads": 32, "vocab_size": DEMO_VOCAB_SIZE},
    vision={**QWEN3VL_2B.vision, "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
            "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24]},
    tie=True,
    seed=3,
)  # fmt: skip

# Bump when the way weights are drawn or written changes (cached checkpoints are rebuilt).
RECIPE_VERSION = 1


def _build(folder: Path, spec: RandomModelSpec) -> None:
    write_demo_tokenizer(folder)
    ids = {
        t["content"]: int(i)
        for i, t in json.loads((folder / "tokenizer_config.json").read_text())[
            "added_tokens_decoder"
        ].items()
    }
    config = qwen3vl_config(spec.text, spec.vision, ids, tie=spec.tie)
    write_random_checkpoint(folder, config, spec.seed)
    (folder / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                "pad_token_id": ids["<|endoftext|>"],
                "do_sample": True,
                "temperature": 0.7,
                "top_k": 20,
                "top_p": 0.8,
                "repetition_penalty": 1.0,
            },
            indent=2,
        )
        + "\n"
    )
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    (folder / "README.md").write_text(
        f"Merlin {spec.name}: random weights in the real Qwen3-VL layout. "
        "Its answers are random text.\n"
    )


def _recipe_hash(spec: RandomModelSpec) -> str:
    """Changes whenever the spec, the tokenizer builder or RECIPE_VERSION changes."""
    h = hashlib.sha256(json.dumps([asdict(spec), RECIPE_VERSION], sort_keys=True).encode())
    h.update((Path(__file__).parent / "demo_tokenizer.py").read_bytes())
    return h.hexdigest()[:12]


def random_checkpoint_dir(spec: RandomModelSpec, cache_root: Path | None = None) -> Path:
    root = Path(cache_root) if cache_root else Path(user_cache_dir("merlin"))
    return root / "checkpoints" / f"{spec.name}-{_recipe_hash(spec)}"


def ensure_random_checkpoint(
    spec: RandomModelSpec, cache_root: Path | None = None, on_build=None
) -> Path:
    """The checkpoint folder, built on first use (atomically: build aside, then rename);
    on_build() is called before a build (a progress message: the 2B one takes minutes)."""
    folder = random_checkpoint_dir(spec, cache_root)
    if (folder / "model.safetensors").is_file():
        return folder
    if on_build is not None:
        on_build()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        _build(tmp, spec)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "model.safetensors").is_file():  # not a concurrent build's win
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def random_demo_checkpoint_dir(cache_root: Path | None = None) -> Path:
    return random_checkpoint_dir(DEMO, cache_root)


def ensure_random_demo_checkpoint(cache_root: Path | None = None) -> Path:
    """The small random-weight checkpoint (tests, fixtures), built on first use."""
    return ensure_random_checkpoint(DEMO, cache_root)


def ensure_demo_checkpoint() -> Path:
    """The default model: the trained demo model shipped in the package (read-only)."""
    from .demo_model import shipped_dir
    from .errors import CheckpointError

    folder = shipped_dir()
    missing = [
        name
        for name in ("config.json", "model.safetensors", "tokenizer.json")
        if not (folder / name).is_file()
    ]
    if missing:
        raise CheckpointError(
            f"the built-in demo model is incomplete ({', '.join(missing)} missing in "
            f"{folder}); reinstall Merlin, or choose a Qwen3-VL checkpoint folder."
        )
    return folder
