"""Make the text-decoder parity fixtures under tests/fixtures/ref_*/ with Hugging Face transformers.

NOT needed by the test suite: the fixtures it writes are committed, and the tests only read them
with NumPy. This script (and only this script) needs torch + transformers; it does not import
Merlin's engine.

How to run (CPU is enough; it takes well under a minute):

    python -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 transformers safetensors numpy
    /tmp/refvenv/bin/python tests/make_reference.py            # all fixtures
    /tmp/refvenv/bin/python tests/make_reference.py --only ref_tied_bf16_v457

The fixtures were made with torch 2.13.0 (CPU wheel) and transformers 5.24.0; reference.json in
each folder records the versions that made it. A rerun with the same versions rewrites every file
byte for byte (all randomness is seeded, torch runs on one thread, the .npz has fixed zip times).

What each fixture is (see tests/fixtures/README.md for the table):

* a tiny random Qwen3-VL checkpoint in the real full format (Qwen3VLForConditionalGeneration:
  model.language_model.* + model.visual.* [+ lm_head.weight when untied]), saved with
  save_pretrained, with config.json and generation_config.json;
* reference.npz: input_ids int64 [n] (a text-only prompt), logits float32 [n, 2048] (plain
  forward, positions 0..n-1), greedy_ids int64 [16] (16 greedy tokens continuing the prompt,
  no stop token), description (0-d str: the JSON of reference.json);
* reference.json: versions, config summary and a few statistics of the reference.

The weights are re-drawn with a large spread (matrices ~ N(0, 1/fan_in), norm weights
1 + 0.1 N(0,1), biases 0.05 N(0,1)) so that a wrong op moves the logits visibly. The reference
is computed in float32 with attn_implementation="eager" from the checkpoint as RELOADED from
disk, i.e. from exactly the stored (bf16/f16-rounded) weights.

Token ids. The fixtures ship no tokenizer, so ids have no text meaning. The special ids copy the
layout of the real Qwen3-VL vocabulary at the top of the 2048-id vocab:

    ENDOFTEXT 2032 (bos, pad, 2nd eos)   IM_START 2033   IM_END 2034 (eos)
    VISION_START 2040   VISION_END 2041   IMAGE_PAD 2042   VIDEO_PAD 2043

Prompts use only ids 0..2031, so they never contain a special id.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import platform
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np

VOCAB = 2048
ENDOFTEXT_ID = 2032
IM_START_ID = 2033
IM_END_ID = 2034
VISION_START_ID = 2040
VISION_END_ID = 2041
IMAGE_PAD_ID = 2042
VIDEO_PAD_ID = 2043
FIRST_SPECIAL_ID = 2032  # prompt ids are drawn from [0, FIRST_SPECIAL_ID)
N_GREEDY = 16

# Vision tower shared by all fixtures (only its tensors' presence/format matters here).
VISION = dict(
    depth=2,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    in_channels=3,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0, 1],
    hidden_act="gelu_pytorch_tanh",
)

FIXTURES = [
    dict(
        # Closest to Qwen3-VL-2B: tied head, bf16, one model.safetensors, theta 5e6, and a
        # config.json rewritten into the published transformers-4.57 spelling.
        name="ref_tied_bf16_v457",
        seed=1001,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=192,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mrope_section=[4, 2, 2],
        rope_theta=5e6,
        tie=True,
        dtype="bfloat16",
        max_shard_size=None,
        spelling="4.57",
        prompt_len=29,
    ),
    dict(
        # Untied head, f32 storage, sharded (3 shards + index.json); MHA (4/4) with
        # num_heads*head_dim (128) != hidden (32); small theta 1e4; 3 layers.
        name="ref_untied_f32_sharded",
        seed=2002,
        hidden_size=32,
        num_hidden_layers=3,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        mrope_section=[6, 5, 5],
        rope_theta=1e4,
        tie=False,
        dtype="float32",
        max_shard_size="500KB",
        spelling="5.x",
        prompt_len=24,
    ),
    dict(
        # Untied head, f16 storage, one file; GQA 8/2 with the real 8B-like ratio 4 and
        # head_dim 64; theta 1e6.
        name="ref_untied_f16_gqa4",
        seed=3003,
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        mrope_section=[12, 10, 10],
        rope_theta=1e6,
        tie=False,
        dtype="float16",
        max_shard_size=None,
        spelling="5.x",
        prompt_len=37,
    ),
]


def build_config(fx: dict):
    from transformers import Qwen3VLConfig

    assert sum(fx["mrope_section"]) == fx["head_dim"] // 2, fx["name"]
    text = dict(
        vocab_size=VOCAB,
        hidden_size=fx["hidden_size"],
        intermediate_size=fx["intermediate_size"],
        num_hidden_layers=fx["num_hidden_layers"],
        num_attention_heads=fx["num_attention_heads"],
        num_key_value_heads=fx["num_key_value_heads"],
        head_dim=fx["head_dim"],
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(fx["rope_theta"]),
            "mrope_section": list(fx["mrope_section"]),
            "mrope_interleaved": True,
        },
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=IM_END_ID,
    )
    return Qwen3VLConfig(
        text_config=text,
        vision_config=dict(VISION, out_hidden_size=fx["hidden_size"]),
        image_token_id=IMAGE_PAD_ID,
        video_token_id=VIDEO_PAD_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        # transformers 5.24 decides tying from this top-level flag only (text_config's is ignored).
        tie_word_embeddings=fx["tie"],
    )


def redraw_weights(model, seed: int) -> None:
    """Large-spread weights: a wrong op must move the logits visibly (spec section 10)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters() lists a tied matrix once; sort so the draw order is fixed.
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith(".bias"):
                new = 0.05 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1:  # RMSNorm / LayerNorm weights
                new = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            else:  # Linear [out, in], Embedding [rows, dim], Conv3d [out, C, T, py, px]
                fan_in = math.prod(p.shape[1:])
                new = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
            p.copy_(new.to(p.dtype))


def to_v457_spelling(folder: Path) -> None:
    """Rewrite config.json as the published Qwen3-VL checkpoints spell it (transformers 4.57)."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    params = text.pop("rope_parameters")
    theta = params["rope_theta"]
    text["rope_theta"] = int(theta) if float(theta).is_integer() else theta
    text["rope_scaling"] = {
        "rope_type": "default",
        "mrope_section": list(params["mrope_section"]),
        "mrope_interleaved": True,
    }
    text["tie_word_embeddings"] = cfg["tie_word_embeddings"]  # published files have it twice
    text["dtype"] = cfg.pop("dtype")  # published: dtype inside text_config, not at top level
    if text.get("pad_token_id", 0) is None:
        del text["pad_token_id"]  # 5.24 writes null; the published files have no such key
    vision.pop("rope_parameters", None)
    vision["model_type"] = "qwen3_vl"
    cfg["transformers_version"] = "4.57.0.dev0"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_npz(path: Path, arrays: dict) -> None:
    """np.savez without timestamps, so a rerun writes identical bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def make_fixture(fx: dict, out_root: Path) -> dict:
    import safetensors
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    name = fx["name"]
    folder = out_root / name
    if folder.exists():
        shutil.rmtree(folder)

    # 1. Build, re-draw, save in the storage dtype.
    torch.manual_seed(fx["seed"])
    config = build_config(fx)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    redraw_weights(model, fx["seed"])
    tied_now = model.lm_head.weight is model.model.language_model.embed_tokens.weight
    assert tied_now == fx["tie"], (name, tied_now)
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
        pad_token_id=ENDOFTEXT_ID,
        # Like the Instruct checkpoints: samples by default. The reference below is greedy.
        do_sample=True,
        top_k=20,
        top_p=0.8,
        temperature=0.7,
        repetition_penalty=1.0,
    )
    model.to(getattr(torch, fx["dtype"]))
    save_kw = {} if fx["max_shard_size"] is None else {"max_shard_size": fx["max_shard_size"]}
    model.save_pretrained(folder, **save_kw)
    del model
    for f in folder.glob("*.safetensors"):
        f.chmod(0o644)  # save_pretrained writes them 0600
    if fx["spelling"] == "4.57":
        to_v457_spelling(folder)

    # 2. Reload exactly what is on disk, compute in float32 with eager attention.
    model = Qwen3VLForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    rp = model.config.text_config.rope_parameters
    assert float(rp["rope_theta"]) == float(fx["rope_theta"]), (name, rp)
    assert list(rp["mrope_section"]) == fx["mrope_section"], (name, rp)
    assert bool(model.config.tie_word_embeddings) == fx["tie"], name
    assert (model.lm_head.weight is model.model.language_model.embed_tokens.weight) == fx["tie"]

    # The loaded weights must be exactly the stored ones (widened to f32).
    files = sorted(folder.glob("*.safetensors"))
    stored = {}
    for f in files:
        stored.update(load_file(f))
    assert ("lm_head.weight" in stored) == (not fx["tie"]), name
    state = model.state_dict()
    for key, t in stored.items():
        assert str(t.dtype) == f"torch.{fx['dtype']}", (key, t.dtype)
        assert torch.equal(state[key], t.to(torch.float32)), key
    expected_keys = set(state) - ({"lm_head.weight"} if fx["tie"] else set())
    assert set(stored) == expected_keys, set(stored) ^ expected_keys

    rng = np.random.default_rng(fx["seed"])
    input_ids = rng.integers(0, FIRST_SPECIAL_ID, size=fx["prompt_len"], dtype=np.int64)
    ids = torch.from_numpy(input_ids)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].to(torch.float32).numpy()
    assert logits.shape == (len(input_ids), VOCAB)

    gc = model.generation_config
    gc.eos_token_id = None
    gc.do_sample = False
    gc.top_k = None
    gc.top_p = None
    gc.temperature = None
    gc.max_new_tokens = N_GREEDY
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_GREEDY
        )
    greedy_ids = out[0, len(input_ids) :].numpy().astype(np.int64)
    assert greedy_ids.shape == (N_GREEDY,), greedy_ids.shape

    # Self-check: a full forward over prompt + greedy tokens must pick the same tokens, and its
    # prompt rows must equal the prompt-only forward. Record how close each greedy pick was.
    full = np.concatenate([input_ids, greedy_ids[:-1]])
    with torch.no_grad():
        full_logits = model(input_ids=torch.from_numpy(full)[None]).logits[0].numpy()
    np.testing.assert_allclose(full_logits[: len(input_ids)], logits, rtol=0, atol=1e-5)
    steps = full_logits[len(input_ids) - 1 :]
    assert (steps.argmax(-1) == greedy_ids).all(), name
    top2 = np.sort(steps, axis=-1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]

    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    description = {
        "fixture": name,
        "made_by": "tests/make_reference.py",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "numpy": np.__version__,
        },
        "config": {
            k: fx[k]
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "mrope_section",
                "rope_theta",
            )
        }
        | {
            "vocab_size": VOCAB,
            "tie_word_embeddings": fx["tie"],
            "storage_dtype": fx["dtype"],
            "sharded": fx["max_shard_size"] is not None,
            "safetensors_files": [f.name for f in files],
            "config_spelling": fx["spelling"],
            "vision": dict(VISION, out_hidden_size=fx["hidden_size"]),
        },
        "token_ids": {
            "endoftext_bos_pad": ENDOFTEXT_ID,
            "im_start": IM_START_ID,
            "im_end_eos": IM_END_ID,
            "vision_start": VISION_START_ID,
            "vision_end": VISION_END_ID,
            "image_pad": IMAGE_PAD_ID,
            "video_pad": VIDEO_PAD_ID,
            "prompt_ids_range": [0, FIRST_SPECIAL_ID - 1],
        },
        "weights": "re-drawn: matrices N(0,1/fan_in), norm weights 1+0.1N(0,1), biases 0.05N(0,1)",
        "reference": {
            "how": "from_pretrained(dtype=float32, attn_implementation='eager') of this folder; "
            "logits = plain forward on input_ids only (positions 0..n-1); greedy_ids = "
            f"generate(do_sample=False, eos_token_id=None, max_new_tokens={N_GREEDY})",
            "prompt_len": int(len(input_ids)),
            "logits_abs_max": float(np.abs(logits).max()),
            "logits_std": float(logits.std()),
            "greedy_top1_minus_top2_min": float(margins.min()),
            "logits_sha256": hashlib.sha256(logits.tobytes()).hexdigest(),
            "greedy_ids": greedy_ids.tolist(),
        },
        "files": sizes,
        "config_json_sha256": hashlib.sha256((folder / "config.json").read_bytes()).hexdigest(),
    }
    text = json.dumps(description, indent=2) + "\n"
    (folder / "reference.json").write_text(text)
    write_npz(
        folder / "reference.npz",
        {
            "input_ids": input_ids,
            "logits": logits.astype(np.float32),
            "greedy_ids": greedy_ids,
            "description": np.array(text),
        },
    )
    return description


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "fixtures",
        help="folder that receives ref_*/ (default: tests/fixtures next to this script)",
    )
    parser.add_argument("--only", action="append", help="make only this fixture (repeatable)")
    args = parser.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass

    wanted = [fx for fx in FIXTURES if not args.only or fx["name"] in args.only]
    if args.only and len(wanted) != len(set(args.only)):
        known = ", ".join(fx["name"] for fx in FIXTURES)
        print(f"unknown fixture name in {args.only}; known: {known}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for fx in wanted:
        d = make_fixture(fx, args.out)
        r = d["reference"]
        print(
            f"{fx['name']}: n={r['prompt_len']} |logits|max={r['logits_abs_max']:.3f} "
            f"std={r['logits_std']:.3f} min greedy margin={r['greedy_top1_minus_top2_min']:.4f} "
            f"greedy={r['greedy_ids']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
