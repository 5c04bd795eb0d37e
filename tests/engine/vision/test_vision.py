"""The image path against transformers' outputs stored in tests/fixtures (tests/make_reference.py):
pixel patches of transformers' PIL image processor, grids, 3D positions and rope deltas,
vision embeddings, logits at every position and greedy tokens for one- and two-image prompts;
then bad input (each case makes its own file), colour modes, the CLI and a checkpoint without
vision weights."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support import FIXTURES

from merlin.engine.checkpoint import Checkpoint, save_safetensors
from merlin.engine.config import load_config
from merlin.engine.errors import CheckpointError, InputError
from merlin.engine.rope import mrope_positions, text_positions
from merlin.engine.text import TextModel, load_text_weights
from merlin.engine.vision import load_preprocess_config, load_vision, prepare_image, smart_resize
from merlin.engine.vision.kernels import POW2, bias_gelu_erf, bias_gelu_tanh

IMAGES = FIXTURES / "vision_images"
IMAGE_TABLE = json.loads((IMAGES / "images.json").read_text())["images"]
VISION_DIRS = sorted(p.parent for p in FIXTURES.glob("ref_*/vision_reference.npz"))


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def pixels():
    return np.load(IMAGES / "pixels.npz")


@pytest.fixture(scope="module")
def pre():
    return load_preprocess_config(IMAGES)


# ---- preprocessing against transformers' Qwen2VLImageProcessorPil ----------------------------


def test_fixture_inventory(pixels):
    assert len(VISION_DIRS) == 2
    with_ref = {k[: -len("_pixel_values")] for k in pixels.files if k.endswith("_pixel_values")}
    # tiny, very wide, very tall, max-pixels cap, no-resize, and the colour modes
    assert {"tiny", "wide", "tall", "cap", "exact", "rgba", "la", "palette", "gray", "cmyk"} <= (
        with_ref
    )
    assert "exif" in with_ref


@pytest.mark.parametrize("name", [n for n, v in IMAGE_TABLE.items() if "grid_thw" in v])
def test_pixel_patches_match_pil_processor(name, pixels, pre):
    image = prepare_image(IMAGES / IMAGE_TABLE[name]["file"], pre)
    ref = pixels[f"{name}_pixel_values"]
    assert image.grid_thw == tuple(pixels[f"{name}_image_grid_thw"].tolist())
    assert image.pixel_values.dtype == np.float32
    assert image.pixel_values.shape == ref.shape
    assert np.abs(image.pixel_values - ref).max() <= 1e-5
    assert image.n_tokens == IMAGE_TABLE[name]["tokens"]


def test_smart_resize_rules():
    assert smart_resize(80, 80, 32, 0, 10**9) == (64, 64)  # 2.5 -> 2, half to even
    assert smart_resize(112, 112, 32, 0, 10**9) == (128, 128)  # 3.5 -> 4
    assert smart_resize(30, 400, 32, 4096, 16384) == (32, 384)
    assert smart_resize(120, 200, 32, 4096, 16384) == (96, 160)  # floor branch
    assert smart_resize(12, 20, 32, 4096, 16384) == (64, 96)  # ceil branch
    assert smart_resize(1, 1, 32, 65536, 16777216) == (256, 256)
    assert smart_resize(768, 1024, 32, 65536, 16777216) == (768, 1024)
    assert smart_resize(2, 400, 32, 4096, 16384) == (32, 928)  # ratio 200 is allowed
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(2, 401, 32, 4096, 16384)


def test_max_pixels_is_a_user_setting(pre):
    full = prepare_image(IMAGES / "cap.png", pre.with_max_pixels(10**7))
    small = prepare_image(IMAGES / "cap.png", pre, max_pixels=32 * 32 * 4)
    assert full.grid_thw == (1, 8, 12)  # 200x120 fits: round to 128x192
    assert small.grid_thw == (1, 2, 4) and small.n_tokens == 2  # 64x32
    with pytest.raises(InputError, match="max-pixels"):
        prepare_image(IMAGES / "cap.png", pre, max_pixels=100)


# ---- colour modes and orientation ------------------------------------------------------------


def _normalised(u8: np.ndarray, pre) -> np.ndarray:
    """[H, W, 3] uint8 -> [3, H, W] as the processor normalises."""
    x = (u8.astype(np.float64) * pre.rescale_factor).astype(np.float32)
    m = np.array(pre.image_mean, np.float32)[:, None, None]
    s = np.array(pre.image_std, np.float32)[:, None, None]
    return (x.transpose(2, 0, 1) - m) / s


def _first_frame(image, pre) -> np.ndarray:
    """PreparedImage -> [3, H, W] of its first temporal frame, undoing the patch order."""
    t, gh, gw = image.grid_thw
    p, m = pre.patch_size, pre.merge_size
    a = image.pixel_values.reshape(gh // m, gw // m, m, m, 3, pre.temporal_patch_size, p, p)
    assert np.array_equal(a[:, :, :, :, :, 0], a[:, :, :, :, :, 1])  # frame repeated
    a = a[:, :, :, :, :, 0].transpose(4, 0, 2, 5, 1, 3, 6)  # C, bh, mh, py, bw, mw, px
    return a.reshape(3, gh * p, gw * p)


def test_rgba_transparent_pixels_become_white(tmp_path, pre):
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:32, :, 3] = 255  # top half opaque red-ish, bottom half fully transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = _first_frame(prepare_image(tmp_path / "a.png", pre), pre)
    expect = np.full((64, 64, 3), 255, np.uint8)
    expect[:32] = (200, 0, 0)
    np.testing.assert_array_equal(out, _normalised(expect, pre))


def test_16_bit_grey_is_scaled_not_clipped(pre):
    image = prepare_image(IMAGES / "gray16.png", pre.with_max_pixels(10**7))
    src = np.asarray(Image.open(IMAGES / "gray16.png")).astype(np.int64)
    u8 = ((src * 255 + 32767) // 65535).astype(np.uint8)
    expect = np.asarray(Image.fromarray(u8, "L").convert("RGB").resize((64, 96), Image.BICUBIC))
    np.testing.assert_array_equal(_first_frame(image, pre), _normalised(expect, pre))
    # transformers' convert("RGB") would clip almost everything to white:
    assert (np.asarray(Image.open(IMAGES / "gray16.png").convert("L")) == 255).mean() > 0.9
    assert (u8 == 255).mean() < 0.1


def test_exif_orientation_is_applied(tmp_path, pre):
    rgb = np.zeros((32, 64, 3), np.uint8)  # 64 wide, 32 tall; left half bright
    rgb[:, :32] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    Image.fromarray(rgb).save(tmp_path / "r.jpg", exif=exif, quality=100)
    image = prepare_image(tmp_path / "r.jpg", pre.with_max_pixels(10**7))
    assert image.original_size == (32, 64)  # now 32 wide, 64 tall
    frame = _first_frame(image, pre)
    assert frame[:, :24].mean() > 1.0 and frame[:, 40:].mean() < -1.0  # bright half on top


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "RGBA", "LA", "PA", "CMYK", "I", "F"])
def test_every_common_mode_converts(tmp_path, pre, mode):
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8), "RGB")
    if mode in ("I", "F"):
        im = base.convert("L").convert(mode)
    else:
        im = base.convert(mode)
    image = prepare_image_from(tmp_path, im, pre)
    assert image.pixel_values.shape[1] == 1536
    assert np.isfinite(image.pixel_values).all()


def prepare_image_from(tmp_path: Path, im: Image.Image, pre):
    path = tmp_path / f"img-{im.mode}.tiff"
    im.save(path)
    return prepare_image(path, pre)


# ---- bad input -------------------------------------------------------------------------------


def _png(width: int, height: int, idat: bytes = b"") -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _assert_clear(exc_info, path, *fragments):
    msg = str(exc_info.value)
    assert str(path) in msg, msg
    for f in fragments:
        assert f in msg, msg


def test_not_an_image(tmp_path, pre):
    path = tmp_path / "notes.png"
    path.write_text("this is a text file, not a picture\n")
    with pytest.raises(InputError) as e:
        prepare_image(path, pre)
    _assert_clear(e, path, "not an image file", "PNG")


def test_truncated_image(tmp_path, pre):
    path = tmp_path / "cut.png"
    data = (IMAGES / "cap.png").read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as e:
        prepare_image(path, pre)
    _assert_clear(e, path, "truncated or corrupt")


def test_corrupt_image(tmp_path, pre):
    path = tmp_path / "bad.png"
    data = bytearray((IMAGES / "cap.png").read_bytes())
    data[200:400] = bytes(200)  # damage the compressed stream
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as e:
        prepare_image(path, pre)
    _assert_clear(e, path, "truncated or corrupt")


def test_decompression_bomb(tmp_path, pre):
    path = tmp_path / "bomb.png"
    path.write_bytes(_png(40000, 40000, zlib.compress(b"\0" * 1000)))  # 1.6 gigapixels
    with pytest.raises(InputError) as e:
        prepare_image(path, pre)
    _assert_clear(e, path, "too large to open safely", "decompression-bomb", "Scale it down")


def test_one_pixel_image(tmp_path, pre):
    path = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (10, 20, 30)).save(path)
    with pytest.raises(InputError) as e:
        prepare_image(path, pre)
    _assert_clear(e, path, "1x1", "larger image")


@pytest.mark.parametrize("size", [(2, 401), (1000, 3)])
def test_extreme_aspect_ratio(tmp_path, pre, size):
    path = tmp_path / "strip.png"
    Image.new("RGB", size, (10, 20, 30)).save(path)
    with pytest.raises(InputError) as e:
        prepare_image(path, pre)
    _assert_clear(e, path, "aspect ratio", "200:1", "Crop")


def test_missing_file_and_folder(tmp_path, pre):
    with pytest.raises(InputError) as e:
        prepare_image(tmp_path / "nope.png", pre)
    _assert_clear(e, tmp_path / "nope.png", "no such file")
    with pytest.raises(InputError) as e:
        prepare_image(tmp_path, pre)
    _assert_clear(e, tmp_path, "folder")


# ---- positions -------------------------------------------------------------------------------


def test_positions_spec_example():
    ids = [1, 2, 3, 40] + [42] * 12 + [41, 5, 6]
    pos, delta = mrope_positions(ids, 42, [(1, 6, 8)], 2)
    assert pos[:, :4].tolist() == [[0, 1, 2, 3]] * 3
    assert set(pos[0, 4:16]) == {4}
    assert pos[1, 4:16].tolist() == [4] * 4 + [5] * 4 + [6] * 4
    assert pos[2, 4:16].tolist() == [4, 5, 6, 7] * 3
    assert pos[:, 16].tolist() == [8, 8, 8]
    assert delta == 10 + 1 - len(ids)


def test_positions_continue_a_conversation():
    ids = [7] * 3 + [42] * 4 + [7] * 2
    pos_all, delta_all = mrope_positions([9] * 5 + ids, 42, [(1, 4, 4)], 2)
    pos, delta = mrope_positions(ids, 42, [(1, 4, 4)], 2, start=5, delta=0)
    assert np.array_equal(pos, pos_all[:, 5:]) and delta == delta_all
    np.testing.assert_array_equal(text_positions(len(ids) + 5, 1, delta)[:, 0], pos_all[:, -1] + 1)


# ---- the whole model against transformers ----------------------------------------------------


@pytest.fixture(params=VISION_DIRS, ids=lambda p: p.name, scope="module")
def vcase(request):
    folder = request.param
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt:
        text = TextModel(cfg.text, load_text_weights(ckpt, cfg))
        vision = load_vision(folder, ckpt, cfg)
    ref = np.load(folder / "vision_reference.npz")
    n = len([k for k in ref.files if k.endswith("_input_ids")])
    assert n >= 2
    prompts = []
    for k in range(n):
        p = f"p{k}_"
        images = [vision.prepare(IMAGES / IMAGE_TABLE[str(m)]["file"]) for m in ref[p + "images"]]
        prompts.append(
            ({key[len(p) :]: ref[key] for key in ref.files if key.startswith(p)}, images)
        )
    return cfg, text, vision, prompts


def test_prompts_have_one_and_two_images(vcase):
    _, _, _, prompts = vcase
    assert sorted(len(images) for _, images in prompts) == [1, 2]


def test_image_positions_match_get_rope_index(vcase):
    cfg, _, _, prompts = vcase
    for ref, images in prompts:
        assert [im.grid_thw for im in images] == [tuple(g) for g in ref["image_grid_thw"].tolist()]
        pos, delta = mrope_positions(
            ref["input_ids"], cfg.image_token_id, [im.grid_thw for im in images], 2
        )
        np.testing.assert_array_equal(pos, ref["position_ids"])
        assert delta == int(ref["rope_delta"])


def test_vision_embeddings_match(vcase):
    _, _, vision, prompts = vcase
    for ref, images in prompts:
        out = vision.encode(images)
        assert rel_err(out.embeds, ref["image_embeds"]) < 1e-5
        assert len(out.deepstack) == len(ref["deepstack"])
        for mine, theirs in zip(out.deepstack, ref["deepstack"]):
            assert rel_err(mine, theirs) < 1e-5


def test_vision_matrices_stay_in_the_file(vcase):
    """The block and merger matrices stay in the checkpoint file (read with pread at each
    encode, never mapped: engine/vision/stored.py); a second encode of the same image reads
    them again to the same bits."""
    _, _, vision, prompts = vcase
    stored = vision.encoder.w.stored
    assert len(stored) == 4 * len(vision.encoder.w.blocks) + 2 * (
        1 + len(vision.encoder.w.deepstack)
    )
    assert all(not hasattr(w, "raw") and w.nbytes > 0 for w in stored)
    images = prompts[0][1]
    first = vision.encode(images)
    again = vision.encode(images)
    np.testing.assert_array_equal(first.embeds, again.embeds)


def test_image_prompt_logits_and_greedy_match(vcase):
    cfg, text, vision, prompts = vcase
    for ref, images in prompts:
        ids = ref["input_ids"]
        pos, delta = mrope_positions(ids, cfg.image_token_id, [im.grid_thw for im in images], 2)
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
        assert logits.shape == ref["logits"].shape
        for i in range(len(ids)):
            assert rel_err(logits[i], ref["logits"][i]) < 1e-4, f"position {i}"
        out = []
        for _ in range(len(ref["greedy_ids"])):
            token = int(np.argmax(logits[-1]))
            out.append(token)
            logits = text.forward(np.array([token]), text_positions(cache.length, 1, delta), cache)
        assert out == ref["greedy_ids"].tolist()


# ---- kernels ---------------------------------------------------------------------------------


def test_gelu_kernels():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 200)) * 4).astype(np.float32)
    x[0, :4] = [-100, -10, 10, 100]
    b = rng.standard_normal(200).astype(np.float32)
    z = x.astype(np.float64) + b
    tanh_ref = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    y = x.copy()
    bias_gelu_tanh(y, b, POW2)
    assert np.abs(y - tanh_ref).max() < 2e-6 * max(1, np.abs(tanh_ref).max())
    from math import erf

    erf_ref = 0.5 * z * (1 + np.vectorize(erf)(z / np.sqrt(2)))
    y = x.copy()
    bias_gelu_erf(y, b)
    assert np.abs(y - erf_ref).max() < 2e-6 * max(1, np.abs(erf_ref).max())


# ---- end to end on the demo checkpoint -------------------------------------------------------


def test_generate_with_images_on_demo(demo_model):
    from merlin.engine.generate import AnswerOptions, Finished, PrefillDone, Tokens, generate
    from merlin.engine.prompt import build_prompt
    from merlin.engine.sampling import SamplingParams
    from merlin.engine.session import Message

    model = demo_model
    images = [
        model.vision.prepare(IMAGES / n, max_pixels=128 * 128) for n in ("cap.png", "tall.png")
    ]
    prompt = build_prompt(model.tokenizer, model.config, "Compare them.", images)
    pad = model.config.image_token_id
    assert prompt.ids.count(pad) == sum(im.n_tokens for im in images)
    first_pad = prompt.ids.index(pad)
    text_ids = model.tokenizer.encode_text("Compare them.")
    assert prompt.ids.index(text_ids[0], first_pad) > len(prompt.ids) - len(text_ids) - 8
    assert prompt.rope_delta < 0
    greedy = SamplingParams(temperature=0.0)
    options = AnswerOptions(greedy, max_new_tokens=6, ignore_eos=True, spec="off")
    events = list(generate(model, prompt, options))
    pre = events[0]
    assert isinstance(pre, PrefillDone) and pre.vision_ms > 0 and pre.n_tokens == len(prompt.ids)
    tokens = [e for e in events if isinstance(e, Tokens) and e.ids]
    assert len(tokens) == 6
    assert tokens[0].profile.other_ms >= pre.vision_ms * 0.9  # the encoder counts as "other"
    assert isinstance(events[-1], Finished) and events[-1].vision_ms > 0
    # the same turn as a conversation (the session's form): the same prompt, the same answer
    conv = build_prompt(model.tokenizer, model.config, [Message.user("Compare them.", images)])
    assert conv.ids == prompt.ids and conv.rope_delta == prompt.rope_delta
    assert np.array_equal(conv.positions, prompt.positions) and conv.spans == prompt.spans
    again = [e.ids for e in generate(model, conv, options) if isinstance(e, Tokens) and e.ids]
    assert again == [t.ids for t in tokens]


def test_checkpoint_without_vision_weights(tmp_path, demo_dir):
    import shutil

    from merlin.engine.generate import AnswerOptions, Tokens, generate
    from merlin.engine.model import load_model
    from merlin.engine.prompt import chat_prompt_ids, text_prompt
    from merlin.engine.sampling import SamplingParams

    folder = tmp_path / "textonly"
    shutil.copytree(demo_dir, folder)
    with Checkpoint(demo_dir) as ckpt:
        tensors = {n: ckpt.read_f32(n) for n in ckpt.tensors if not n.startswith("model.visual.")}
    save_safetensors(folder / "model.safetensors", tensors, dtype="F32")
    model = load_model(folder)
    assert not model.vision.available
    with pytest.raises(CheckpointError, match="no vision weights") as e:
        model.vision.prepare(IMAGES / "cap.png")
    assert "text chat works" in str(e.value)
    # text chat keeps working
    ids = chat_prompt_ids(model.tokenizer, "Hello")
    options = AnswerOptions(SamplingParams(temperature=0.0), max_new_tokens=3, spec="off")
    events = generate(model, text_prompt(ids), options)
    assert len([e for e in events if isinstance(e, Tokens) and e.ids]) == 3


# ---- CLI -------------------------------------------------------------------------------------


def test_cli_generate_and_logits_with_images(demo_dir, tmp_path):
    from support import run_cli

    r = run_cli(
        "generate",
        "--model",
        str(demo_dir),
        "--image",
        str(IMAGES / "cap.png"),
        "--image",
        str(IMAGES / "exif.png"),
        "--max-pixels",
        str(128 * 128),
        "--temperature",
        "0",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "--json",
        "What is in these pictures?",
    )
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["event"] == "prefill" and events[0]["vision_ms"] > 0
    assert events[0]["n_tokens"] > 2 * 16  # two images of 16 tokens each at 128x128
    assert len([e for e in events if e["event"] == "tokens" and e["ids"]]) == 4
    out = tmp_path / "l.npy"
    r = run_cli(
        "logits",
        "--model",
        str(demo_dir),
        "--image",
        str(IMAGES / "wide.png"),
        "--out",
        str(out),
        "Describe it.",
    )
    assert r.returncode == 0, r.stderr
    logits = np.load(out)
    assert logits.shape[0] > 12 and np.isfinite(logits).all()


def test_cli_bad_image_is_one_clear_line(demo_dir, tmp_path):
    from support import assert_user_error, run_cli

    bad = tmp_path / "notes.png"
    bad.write_text("hello")
    r = run_cli("generate", "--model", str(demo_dir), "--image", str(bad), "Hi")
    assert_user_error(r, str(bad), "not an image file")
    assert len(r.stderr.strip().splitlines()) == 1
