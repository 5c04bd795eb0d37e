"""Make the parity fixtures under tests/fixtures/ (text and images) with Hugging Face transformers.

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

The two mixture-of-experts fixtures (moe_vl_bf16, moe_text_sharded; MOE_FIXTURES below) add
the router's decisions to reference.npz (tests/fixtures/README.md describes them).

Images (tests/fixtures/vision_images/, shared by the model fixtures):

* deterministic images made by this script (PNG; CMYK as an uncompressed TIFF): tiny (upscaled
  to min_pixels), very wide, very tall, one above the max-pixels cap, one needing no resize,
  RGBA, LA, P with a transparent index, L, CMYK, EXIF-rotated, and a 16-bit grey one;
* preprocessor_config.json: the hub file's keys with a small pixel budget (4096..16384 pixels,
  so 4..16 tokens per image) and per-channel mean/std that differ;
* pixels.npz: `<name>_pixel_values` float32 [N, 1536] and `<name>_image_grid_thw` int64 [3]
  from transformers' `Qwen2VLImageProcessorPil` (spec section 10) on the decoded file (EXIF
  orientation applied for exif.png); none for the 16-bit image (transformers clips it to 8
  bits, Merlin scales it); images.json describes each image.

For the fixtures with `vision_prompts` (ref_tied_bf16_v457, ref_untied_f16_gqa4), also
preprocessor_config.json (the same file) and vision_reference.npz/.json: per prompt k (one
image, then two images), `p<k>_input_ids` (the image pads already expanded to t*h*w/4 each),
`p<k>_images`, `p<k>_image_grid_thw`, `p<k>_position_ids` [3, n] and `p<k>_rope_delta` from
`model.model.get_rope_index`, `p<k>_image_embeds` / `p<k>_deepstack` from get_image_features,
`p<k>_logits` [n, 2048] (one forward with pixel_values, image_grid_thw, mm_token_type_ids) and
`p<k>_greedy_ids` [16] (generate, greedy, no stop token).

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
        # Image prompts (vision_reference.npz): one image hitting the max-pixels cap; two
        # images, very wide and very tall.
        vision_prompts=[["cap"], ["wide", "tall"]],
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
        # One tiny (upscaled) image; two images, one needing no resize and one with alpha.
        vision_prompts=[["tiny"], ["exact", "rgba"]],
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


def write_npz(path: Path, arrays: dict, compress: bool = False) -> None:
    """np.savez without timestamps, so a rerun writes identical bytes."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = method
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
    if fx.get("vision_prompts"):
        make_vision_reference(fx, folder, model, out_root / IMAGES_DIR)
    return description


# ---- images ---------------------------------------------------------------------------------

IMAGES_DIR = "vision_images"

# The fixture's preprocessor_config.json: the hub file's keys with a small pixel budget (4..16
# merged tokens per image, so the fixtures stay small and the max-pixels cap is easy to hit) and
# per-channel mean/std that differ (a channel mix-up shows; the hub uses 0.5 for all three).
PREPROCESSOR = {
    "size": {"longest_edge": 16384, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "rescale_factor": 0.00392156862745098,
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessor",
}

# name -> (file, width, height, what it exercises, expected grid (t, h, w) or None).
# A grid of None: no transformers reference (see "gray16").
IMAGES = {
    "tiny": ("tiny.png", 20, 12, "RGB, below min_pixels: upscaled (ceil branch)", (1, 4, 6)),
    "wide": ("wide.png", 400, 30, "RGB 13:1, round(12.5) -> 12 (half to even)", (1, 2, 24)),
    "tall": ("tall.png", 30, 300, "RGB 1:10", (1, 18, 2)),
    "cap": ("cap.png", 200, 120, "RGB above max_pixels: downscaled (floor branch)", (1, 6, 10)),
    "exact": ("exact.png", 64, 96, "RGB, multiple of 32 within the limits: no resize", (1, 6, 4)),
    "rgba": ("rgba.png", 72, 56, "RGBA, alpha 0..255: composited on white", (1, 4, 4)),
    "la": ("la.png", 56, 72, "LA: composited on white", (1, 4, 4)),
    "palette": ("palette.png", 64, 48, "P with a transparent index (tRNS)", (1, 4, 4)),
    "gray": ("gray.png", 50, 40, "L, upscaled", (1, 4, 6)),
    "cmyk": ("cmyk.tiff", 48, 64, "CMYK (uncompressed TIFF)", (1, 4, 4)),
    "exif": ("exif.png", 80, 48, "RGB, EXIF orientation 6 (rotate 90): 48x80 after", (1, 4, 4)),
    "gray16": ("gray16.png", 40, 50, "I;16: Merlin scales to 8 bits, transformers clips", None),
}


def _texture(h: int, w: int, seed: int, channels: int = 3) -> np.ndarray:
    """Smooth waves + a ramp + noise, uint8 [h, w, channels]: resampling errors show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    out = []
    for _ in range(channels):
        fy, fx = rng.uniform(0.05, 0.5, 2)
        phase = rng.uniform(0, 2 * np.pi)
        v = 127.5 + 70 * np.sin(fy * y + phase) * np.cos(fx * x)
        v += 40 * (x / max(w - 1, 1) - y / max(h - 1, 1)) + rng.normal(0, 10, (h, w))
        out.append(v)
    return np.clip(np.rint(np.stack(out, -1)), 0, 255).astype(np.uint8)


def _make_image(name: str, w: int, h: int):
    from PIL import Image

    seed = 7000 + sorted(IMAGES).index(name)
    if name == "rgba":
        a = np.tile(np.linspace(0, 255, w).round().astype(np.uint8), (h, 1))
        a[: h // 4, : w // 4] = 0
        a[-h // 4 :, -w // 4 :] = 255
        return Image.fromarray(np.dstack([_texture(h, w, seed), a]), "RGBA")
    if name == "la":
        t = _texture(h, w, seed, 2)
        t[..., 1] = np.tile(np.linspace(0, 255, h).round().astype(np.uint8)[:, None], (1, w))
        return Image.fromarray(t, "LA")
    if name == "palette":
        idx = (_texture(h, w, seed, 1)[..., 0] // 16).astype(np.uint8)  # 16 colours
        im = Image.fromarray(idx, "L").convert("P")
        pal = np.random.default_rng(seed).integers(0, 256, (256, 3)).astype(np.uint8)
        im.putpalette(pal.ravel().tolist())
        im.info["transparency"] = 3
        return im
    if name == "gray":
        return Image.fromarray(_texture(h, w, seed, 1)[..., 0], "L")
    if name == "cmyk":
        return Image.fromarray(_texture(h, w, seed, 4), "CMYK")
    if name == "gray16":
        y, x = np.mgrid[0:h, 0:w]
        v = (x * 65535 // (w - 1) + y * 97) % 65536
        return Image.fromarray(v.astype(np.uint16))  # mode I;16
    return Image.fromarray(_texture(h, w, seed), "RGB")


def hf_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    keys = ("size", "patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")
    keys += ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "rescale_factor")
    return Qwen2VLImageProcessorPil(**{k: PREPROCESSOR[k] for k in keys})


def open_for_reference(path: Path):
    """What a transformers user hands the processor: the decoded file, EXIF orientation applied
    (as transformers.image_utils.load_image does, but without its convert("RGB"), which would
    drop alpha instead of letting the processor composite it on white)."""
    from PIL import Image, ImageOps

    im = Image.open(path)
    im.load()
    return ImageOps.exif_transpose(im) if name_of(path) == "exif" else im


def name_of(path: Path) -> str:
    return Path(path).stem


def make_images(folder: Path) -> dict:
    """Write the images, preprocessor_config.json, pixels.npz (transformers' PIL-processor
    pixel_values + image_grid_thw per image) and images.json. Returns name -> reference."""
    import transformers
    from PIL import Image

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    proc = hf_image_processor()
    arrays, refs, table = {}, {}, {}
    for name, (file, w, h, what, grid) in IMAGES.items():
        im = _make_image(name, w, h)
        assert im.size == (w, h), (name, im.size)
        path = folder / file
        if name == "exif":
            exif = Image.Exif()
            exif[0x0112] = 6  # Orientation: rotate 90 CW to display
            im.save(path, exif=exif)
        elif name == "cmyk":
            im.save(path, compression=None)
        else:
            im.save(path, optimize=False)
        loaded = open_for_reference(path)
        table[name] = {"file": file, "size": [w, h], "mode": loaded.mode, "what": what}
        if grid is None:
            continue
        out = proc(images=[loaded], return_tensors="np")
        pv = np.asarray(out["pixel_values"])
        thw = np.asarray(out["image_grid_thw"])[0].astype(np.int64)
        assert pv.dtype == np.float32 and pv.shape == (int(np.prod(thw)), 1536), (name, pv.shape)
        assert tuple(thw.tolist()) == grid, (name, thw, grid)
        if name == "exif":
            assert loaded.size == (h, w), loaded.size  # the rotation was applied
        arrays[f"{name}_pixel_values"] = pv
        arrays[f"{name}_image_grid_thw"] = thw
        refs[name] = (pv, thw)
        table[name]["grid_thw"] = list(grid)
        table[name]["tokens"] = int(np.prod(thw)) // 4
    description = {
        "made_by": "tests/make_reference.py",
        "versions": {
            "transformers": transformers.__version__,
            "pillow": Image.__version__,
            "numpy": np.__version__,
        },
        "processor": "transformers Qwen2VLImageProcessorPil(**preprocessor_config.json), "
        "called on the decoded file (EXIF orientation applied for exif.png)",
        "images": table,
    }
    text = json.dumps(description, indent=2) + "\n"
    (folder / "images.json").write_text(text)
    write_npz(folder / "pixels.npz", arrays | {"description": np.array(text)}, compress=True)
    return refs


def make_vision_reference(fx: dict, folder: Path, model, images_dir: Path) -> None:
    """vision_reference.npz/.json and preprocessor_config.json in a model fixture folder."""
    import torch

    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    pixels = np.load(images_dir / "pixels.npz")
    rng = np.random.default_rng(fx["seed"] + 1)
    arrays, prompts = {}, []
    for k, names in enumerate(fx["vision_prompts"]):
        pv = np.concatenate([pixels[f"{n}_pixel_values"] for n in names])
        grid = np.stack([pixels[f"{n}_image_grid_thw"] for n in names])
        counts = [int(np.prod(g)) // 4 for g in grid]
        user, nl, assistant = (int(i) for i in rng.integers(0, FIRST_SPECIAL_ID, 3))
        ids = [IM_START_ID, user, nl]
        for c in counts:
            ids += [VISION_START_ID] + [IMAGE_PAD_ID] * c + [VISION_END_ID]
        ids += rng.integers(0, FIRST_SPECIAL_ID, 6).tolist()
        ids += [IM_END_ID, nl, IM_START_ID, assistant, nl]
        input_ids = np.array(ids, np.int64)
        t_ids = torch.from_numpy(input_ids)[None]
        mm = (t_ids == IMAGE_PAD_ID).to(torch.int64)
        t_pv, t_grid = torch.from_numpy(pv), torch.from_numpy(grid)
        kw = dict(pixel_values=t_pv, image_grid_thw=t_grid)
        with torch.no_grad():
            pos, delta = model.model.get_rope_index(
                t_ids, mm_token_type_ids=mm, image_grid_thw=t_grid
            )
            feats = model.model.get_image_features(t_pv, t_grid)
            embeds = torch.cat(feats.pooler_output).numpy()
            deep = np.stack([torch.cat(f).numpy() for f in feats.deepstack_features])
            model.model.rope_deltas = None
            logits = model(input_ids=t_ids, mm_token_type_ids=mm, **kw).logits[0].numpy()
            model.model.rope_deltas = None
            out = model.generate(
                input_ids=t_ids,
                attention_mask=torch.ones_like(t_ids),
                mm_token_type_ids=mm,
                max_new_tokens=N_GREEDY,
                **kw,
            )
            greedy = out[0, len(input_ids) :].numpy().astype(np.int64)
            assert greedy.shape == (N_GREEDY,), greedy.shape
            # Self-check as for the text reference: one forward over prompt + greedy tokens.
            full = torch.from_numpy(np.concatenate([input_ids, greedy[:-1]]))[None]
            mm_full = (full == IMAGE_PAD_ID).to(torch.int64)
            model.model.rope_deltas = None
            full_logits = model(input_ids=full, mm_token_type_ids=mm_full, **kw).logits[0].numpy()
            model.model.rope_deltas = None
        np.testing.assert_allclose(full_logits[: len(ids)], logits, rtol=0, atol=1e-5)
        steps = full_logits[len(ids) - 1 :]
        assert (steps.argmax(-1) == greedy).all(), (fx["name"], k)
        top2 = np.sort(steps, axis=-1)[:, -2:]
        position_ids = pos[:, 0, :].numpy().astype(np.int64)
        assert position_ids.shape == (3, len(ids))
        p = f"p{k}_"
        arrays |= {
            p + "input_ids": input_ids,
            p + "images": np.array(names),
            p + "image_grid_thw": grid.astype(np.int64),
            p + "position_ids": position_ids,
            p + "rope_delta": np.array(int(delta.reshape(-1)[0]), np.int64),
            p + "image_embeds": embeds.astype(np.float32),
            p + "deepstack": deep.astype(np.float32),
            p + "logits": logits.astype(np.float32),
            p + "greedy_ids": greedy,
        }
        prompts.append(
            {
                "images": names,
                "image_grid_thw": grid.tolist(),
                "image_tokens": counts,
                "prompt_len": len(ids),
                "rope_delta": int(delta.reshape(-1)[0]),
                "logits_abs_max": float(np.abs(logits).max()),
                "greedy_top1_minus_top2_min": float((top2[:, 1] - top2[:, 0]).min()),
                "greedy_ids": greedy.tolist(),
            }
        )
    description = {
        "fixture": fx["name"],
        "made_by": "tests/make_reference.py",
        "how": "input_ids = <im_start> u nl [<vs> <image_pad>*n <ve>]... 6 random ids <im_end> "
        "nl <im_start> a nl, with n = t*h*w/4 per image; pixel_values and image_grid_thw from "
        f"{IMAGES_DIR}/pixels.npz; mm_token_type_ids = 1 at the pads. position_ids/rope_delta "
        "= model.model.get_rope_index; image_embeds/deepstack = get_image_features; logits = "
        "one forward; greedy_ids = generate(do_sample=False, eos_token_id=None, "
        f"max_new_tokens={N_GREEDY}); float32, eager attention, weights as stored.",
        "prompts": prompts,
    }
    text = json.dumps(description, indent=2) + "\n"
    (folder / "vision_reference.json").write_text(text)
    write_npz(folder / "vision_reference.npz", arrays | {"description": np.array(text)})


# ---- mixture-of-experts fixtures ------------------------------------------------------------
#
# Two more folders, named moe_* (not ref_*, so the dense tests' inventories stay as they are;
# tests/engine/test_moe.py reads them):
#
# * moe_vl_bf16: Qwen3VLMoeForConditionalGeneration in the published layout (fused 3D experts
#   `mlp.experts.gate_up_proj` [E, D, 2I] and `down_proj` [E, I, D], transposed against the
#   in-memory [E, 2I, D]), config.json rewritten into the 4.57 spelling, untied head, one
#   dense layer (mlp_only_layers), with the one- and two-image prompts of vision_reference.npz;
# * moe_text_sharded: Qwen3MoeForCausalLM (flat config, `model.layers.*`, per-expert
#   `mlp.experts.N.gate_proj.weight`), bf16 in shards + index, norm_topk_prob false,
#   decoder_sparse_step 2 (layers 0 and 2 dense).
#
# Both also store the router's decisions for the prompt: `router_indices` int64 [L_moe, n, k]
# (torch.topk order) and `router_weights` float32 [L_moe, n, k] from a hook on each
# layer's `mlp.gate`.

MOE_FIXTURES = [
    dict(
        name="moe_vl_bf16",
        arch="vl",
        seed=4004,
        hidden_size=64,
        num_hidden_layers=3,
        intermediate_size=96,
        moe_intermediate_size=96,
        num_experts=8,
        num_experts_per_tok=3,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mrope_section=[4, 2, 2],
        rope_theta=5e6,
        tie=False,
        dtype="bfloat16",
        max_shard_size=None,
        prompt_len=31,
        vision_prompts=[["cap"], ["wide", "tall"]],
    ),
    dict(
        name="moe_text_sharded",
        arch="text",
        seed=5005,
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=6,
        num_experts_per_tok=4,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        norm_topk_prob=False,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=1e6,
        tie=False,
        dtype="bfloat16",
        max_shard_size="100KB",
        prompt_len=27,
    ),
]


def build_moe_model(fx: dict):
    from transformers import (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    text = dict(
        vocab_size=VOCAB,
        hidden_size=fx["hidden_size"],
        intermediate_size=fx["intermediate_size"],
        moe_intermediate_size=fx["moe_intermediate_size"],
        num_experts=fx["num_experts"],
        num_experts_per_tok=fx["num_experts_per_tok"],
        decoder_sparse_step=fx["decoder_sparse_step"],
        mlp_only_layers=list(fx["mlp_only_layers"]),
        norm_topk_prob=fx["norm_topk_prob"],
        num_hidden_layers=fx["num_hidden_layers"],
        num_attention_heads=fx["num_attention_heads"],
        num_key_value_heads=fx["num_key_value_heads"],
        head_dim=fx["head_dim"],
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=IM_END_ID,
    )
    if fx["arch"] == "text":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": float(fx["rope_theta"])}
        config = Qwen3MoeConfig(**text, tie_word_embeddings=fx["tie"])
        return Qwen3MoeForCausalLM(config)
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": float(fx["rope_theta"]),
        "mrope_section": list(fx["mrope_section"]),
        "mrope_interleaved": True,
    }
    config = Qwen3VLMoeConfig(
        text_config=text,
        vision_config=dict(VISION, out_hidden_size=fx["hidden_size"]),
        image_token_id=IMAGE_PAD_ID,
        video_token_id=VIDEO_PAD_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        tie_word_embeddings=fx["tie"],
    )
    return Qwen3VLMoeForConditionalGeneration(config)


def moe_to_v457_spelling(folder: Path) -> None:
    """config.json of Qwen3-VL-30B-A3B as published (transformers 4.57 spelling)."""
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
    text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    text["dtype"] = cfg.pop("dtype")
    text["num_experts"] = text.pop("num_local_experts")  # 5.x writes its attribute alias
    if text.get("pad_token_id", 0) is None:
        del text["pad_token_id"]
    vision.pop("rope_parameters", None)
    vision["model_type"] = "qwen3_vl_moe"
    cfg["transformers_version"] = "4.57.0.dev0"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def moe_text_published_spelling(folder: Path) -> None:
    """config.json of Qwen3-30B-A3B as published: rope_theta at the top level, rope_scaling
    null, the sliding-window keys."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = float(params["rope_theta"])
    cfg["rope_scaling"] = None
    cfg["use_sliding_window"] = False
    cfg["sliding_window"] = None
    cfg["max_window_layers"] = cfg["num_hidden_layers"]
    cfg["num_experts"] = cfg.pop("num_local_experts")  # 5.x writes its attribute alias
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = "4.51.0"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def moe_to_published_experts(folder: Path) -> None:
    """Store the fused experts as the published Qwen3-VL-MoE files do (transformers 4.57's
    parameters: gate_up_proj [E, D, 2I], down_proj [E, I, D]); transformers 5.x saves its
    in-memory [E, 2I, D] / [E, D, I] and transposes a file whose shape differs while loading
    (conversion_mapping "qwen3_vl_moe": Transpose(1, 2, check_dims=True))."""
    from safetensors.torch import load_file, save_file

    for f in sorted(folder.glob("*.safetensors")):
        tensors = load_file(f)
        for key in list(tensors):
            if key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                tensors[key] = tensors[key].transpose(1, 2).contiguous()
        save_file(tensors, f, metadata={"format": "pt"})
        f.chmod(0o644)


def moe_layers(model, fx: dict) -> list[int]:
    return [
        i
        for i in range(fx["num_hidden_layers"])
        if i not in fx["mlp_only_layers"] and (i + 1) % fx["decoder_sparse_step"] == 0
    ]


def record_routing(model, fx: dict):
    """Hooks on each MoE layer's router: (indices [L_moe, n, k], weights [L_moe, n, k]) of the
    last forward."""
    decoder = model.model.language_model if fx["arch"] == "vl" else model.model
    seen = {}
    hooks = []
    for i in moe_layers(model, fx):

        def hook(module, args, out, i=i):
            seen[i] = (out[2].numpy().astype(np.int64), out[1].float().numpy())

        hooks.append(decoder.layers[i].mlp.gate.register_forward_hook(hook))
    return seen, hooks


def make_moe_fixture(fx: dict, out_root: Path) -> dict:
    import safetensors
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import (
        GenerationConfig,
        Qwen3MoeForCausalLM,
        Qwen3VLMoeForConditionalGeneration,
    )

    name = fx["name"]
    folder = out_root / name
    if folder.exists():
        shutil.rmtree(folder)
    torch.manual_seed(fx["seed"])
    model = build_moe_model(fx).to(torch.float32).eval()
    redraw_weights(model, fx["seed"])
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
        pad_token_id=ENDOFTEXT_ID,
        do_sample=True,
        top_k=20,
        top_p=0.8,
        temperature=0.7,
    )
    model.to(getattr(torch, fx["dtype"]))
    save_kw = {} if fx["max_shard_size"] is None else {"max_shard_size": fx["max_shard_size"]}
    model.save_pretrained(folder, **save_kw)
    del model
    for f in folder.glob("*.safetensors"):
        f.chmod(0o644)
    if fx["arch"] == "vl":
        inter = fx["moe_intermediate_size"]
        assert fx["hidden_size"] not in (inter, 2 * inter)  # unambiguous layouts
        moe_to_published_experts(folder)
        moe_to_v457_spelling(folder)
    else:
        moe_text_published_spelling(folder)

    cls = Qwen3VLMoeForConditionalGeneration if fx["arch"] == "vl" else Qwen3MoeForCausalLM
    model = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    files = sorted(folder.glob("*.safetensors"))
    stored = {}
    for f in files:
        stored.update(load_file(f))
    # The published layouts, as Merlin reads them (transformers converts them while loading).
    prefix = "model.language_model." if fx["arch"] == "vl" else "model."
    d, i_moe, e = fx["hidden_size"], fx["moe_intermediate_size"], fx["num_experts"]
    for li in moe_layers(model, fx):
        p = f"{prefix}layers.{li}.mlp."
        assert tuple(stored[p + "gate.weight"].shape) == (e, d), p
        if fx["arch"] == "vl":
            assert tuple(stored[p + "experts.gate_up_proj"].shape) == (e, d, 2 * i_moe)
            assert tuple(stored[p + "experts.down_proj"].shape) == (e, i_moe, d)
        else:
            assert tuple(stored[p + "experts.0.gate_proj.weight"].shape) == (i_moe, d)
            assert tuple(stored[p + f"experts.{e - 1}.down_proj.weight"].shape) == (d, i_moe)
    assert ("lm_head.weight" in stored) == (not fx["tie"]), name
    if fx["max_shard_size"]:
        assert len(files) > 1, files

    rng = np.random.default_rng(fx["seed"])
    input_ids = rng.integers(0, FIRST_SPECIAL_ID, size=fx["prompt_len"], dtype=np.int64)
    ids = torch.from_numpy(input_ids)[None]
    seen, hooks = record_routing(model, fx)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].to(torch.float32).numpy()
    for h in hooks:
        h.remove()
    layers = moe_layers(model, fx)
    router_indices = np.stack([seen[i][0] for i in layers])
    router_weights = np.stack([seen[i][1] for i in layers]).astype(np.float32)
    k = fx["num_experts_per_tok"]
    assert router_indices.shape == (len(layers), len(input_ids), k), router_indices.shape

    gc = model.generation_config
    gc.eos_token_id = None
    gc.do_sample = False
    gc.top_k = None
    gc.top_p = None
    gc.temperature = None
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_GREEDY
        )
    greedy_ids = out[0, len(input_ids) :].numpy().astype(np.int64)
    assert greedy_ids.shape == (N_GREEDY,)
    full = np.concatenate([input_ids, greedy_ids[:-1]])
    with torch.no_grad():
        full_logits = model(input_ids=torch.from_numpy(full)[None]).logits[0].numpy()
    np.testing.assert_allclose(full_logits[: len(input_ids)], logits, rtol=0, atol=1e-5)
    steps = full_logits[len(input_ids) - 1 :]
    assert (steps.argmax(-1) == greedy_ids).all(), name
    top2 = np.sort(steps, axis=-1)[:, -2:]

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
        "config": {k_: v for k_, v in fx.items() if k_ not in ("name", "seed")},
        "moe_layers": layers,
        "safetensors_files": [f.name for f in files],
        "reference": {
            "prompt_len": int(len(input_ids)),
            "logits_abs_max": float(np.abs(logits).max()),
            "logits_std": float(logits.std()),
            "greedy_top1_minus_top2_min": float((top2[:, 1] - top2[:, 0]).min()),
            "greedy_ids": greedy_ids.tolist(),
        },
        "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir())},
    }
    text = json.dumps(description, indent=2) + "\n"
    (folder / "reference.json").write_text(text)
    write_npz(
        folder / "reference.npz",
        {
            "input_ids": input_ids,
            "logits": logits.astype(np.float32),
            "greedy_ids": greedy_ids,
            "router_indices": router_indices,
            "router_weights": router_weights,
            "description": np.array(text),
        },
    )
    if fx.get("vision_prompts"):
        make_vision_reference(fx, folder, model, out_root / IMAGES_DIR)
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

    wanted = [fx for fx in FIXTURES + MOE_FIXTURES if not args.only or fx["name"] in args.only]
    if args.only and len(wanted) != len(set(args.only)):
        known = ", ".join(fx["name"] for fx in FIXTURES + MOE_FIXTURES)
        print(f"unknown fixture name in {args.only}; known: {known}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    images = make_images(args.out / IMAGES_DIR)
    print(f"{IMAGES_DIR}: {len(IMAGES)} images, {len(images)} with HF pixel_values")
    for fx in wanted:
        make = make_moe_fixture if fx in MOE_FIXTURES else make_fixture
        d = make(fx, args.out)
        r = d["reference"]
        print(
            f"{fx['name']}: n={r['prompt_len']} |logits|max={r['logits_abs_max']:.3f} "
            f"std={r['logits_std']:.3f} min greedy margin={r['greedy_top1_minus_top2_min']:.4f} "
            f"greedy={r['greedy_ids']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
