"""q8 vision weights (engine/vision/qweights.py) against the f32 reference on the fixtures of
tests/fixtures (tests/make_reference.py): cosine of the image embeddings and of every DeepStack
level >= 0.999, and the greedy answers of the fixtures' image prompts unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import FIXTURES

from merlin.engine.checkpoint import Checkpoint
from merlin.engine.config import load_config
from merlin.engine.errors import InputError
from merlin.engine.rope import mrope_positions, text_positions
from merlin.engine.text import TextModel, load_text_weights
from merlin.engine.threads import one_thread
from merlin.engine.vision import encoder, load_vision
from merlin.engine.vision.qweights import quantized_bytes

IMAGES = FIXTURES / "vision_images"
IMAGE_TABLE = json.loads((IMAGES / "images.json").read_text())["images"]
VISION_DIRS = sorted(p.parent for p in FIXTURES.glob("ref_*/vision_reference.npz"))


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(params=VISION_DIRS, ids=lambda p: p.name, scope="module")
def case(request):
    folder = request.param
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt:
        text = TextModel(cfg.text, load_text_weights(ckpt, cfg))
        vision = load_vision(folder, ckpt, cfg)
    ref = np.load(folder / "vision_reference.npz")
    prompts = []
    for k in range(len([n for n in ref.files if n.endswith("_input_ids")])):
        p = f"p{k}_"
        images = [vision.prepare(IMAGES / IMAGE_TABLE[str(m)]["file"]) for m in ref[p + "images"]]
        prompts.append(({n[len(p) :]: ref[n] for n in ref.files if n.startswith(p)}, images))
    return cfg, text, vision, prompts


def test_q8_embeddings_and_deepstack_match_f32(case):
    _, _, vision, prompts = case
    assert len(VISION_DIRS) == 2
    for _, images in prompts:
        vision.set_weights_format("f32")
        f32 = vision.encode(images)
        vision.set_weights_format("q8")
        q8 = vision.encode(images)
        assert vision.weights_format == "q8" and quantized_bytes(vision.encoder.w.stored) > 0
        assert not np.array_equal(q8.embeds, f32.embeds)  # it did run another path
        assert cosine(q8.embeds, f32.embeds) >= 0.999
        assert len(q8.deepstack) == len(f32.deepstack) >= 1
        for a, b in zip(q8.deepstack, f32.deepstack):
            assert cosine(a, b) >= 0.999
    vision.set_weights_format("f32")


def _teacher_forced_logits(cfg, text, vision, ref, images, fmt):
    """Last-row logits of the prompt and of each step fed the reference's greedy tokens."""
    vision.set_weights_format(fmt)
    ids = ref["input_ids"]
    pos, delta = mrope_positions(ids, cfg.image_token_id, [im.grid_thw for im in images], 2)
    inputs = vision.prompt_inputs(ids, images)
    cache = text.new_cache(256)
    logits = text.forward(
        ids, pos, cache, embeds=inputs.embeds, embed_rows=inputs.rows, deepstack=inputs.deepstack
    )
    rows = [logits[-1].copy()]
    for token in ref["greedy_ids"][:-1].tolist():
        logits = text.forward(np.array([token]), text_positions(cache.length, 1, delta), cache)
        rows.append(logits[-1].copy())
    return np.array(rows)


def test_q8_greedy_answers_unchanged(case):
    """At every step of every fixture prompt the q8 logits stay within 3% of f32's scale, pick
    the same token wherever f32's top-2 margin exceeds twice that step's difference; the whole
    greedy answer is the same wherever no step is a near-tie. (One step of one fixture prompt
    has an f32 margin of 0.004, a tie no 8-bit weight format keeps: docs/vision.md.)"""
    cfg, text, vision, prompts = case
    try:
        for ref, images in prompts:
            f32 = _teacher_forced_logits(cfg, text, vision, ref, images, "f32")
            q8 = _teacher_forced_logits(cfg, text, vision, ref, images, "q8")
            greedy = ref["greedy_ids"].tolist()
            assert np.argmax(f32, axis=1).tolist() == greedy  # the f32 path is the reference
            diff = np.abs(q8 - f32).max(axis=1)
            assert diff.max() < 0.03 * np.abs(f32).max()  # 3% of the logits' scale
            top2 = np.sort(f32, axis=1)[:, -2:]
            margin = top2[:, 1] - top2[:, 0]
            clear = margin > 2 * diff
            assert (np.argmax(q8, axis=1) == greedy)[clear].all()
            if clear.all():
                assert np.argmax(q8, axis=1).tolist() == greedy
    finally:
        vision.set_weights_format("f32")


def test_unknown_vision_weights_format(case):
    _, _, vision, _ = case
    with pytest.raises(InputError, match="f32 or q8"):
        vision.set_weights_format("q4")


def test_q8_element_wise_kernels_on_the_kernel_threads_equal_one_thread(case):
    """The q8 encoder splits the rows of its element-wise kernels over Python threads
    (VisionEncoder._by_rows): every row computed as the single-threaded kernel computes it
    (row counts that split evenly and not)."""
    import numba

    from merlin.engine.vision.kernels import (
        POW2,
        add_bias_residual,
        bias_gelu_tanh,
        layernorm,
        split_heads_rope,
    )

    _, _, vision, _ = case
    enc = vision.encoder
    rng = np.random.default_rng(8)

    def rand(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(4)

    heads, hd = 2, 8
    bias, w = rand(3 * heads * hd), rand(3 * heads * hd)
    before = numba.get_num_threads()
    try:
        enc.set_weights_format("q8")
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        for rows in (1, 37, 64):
            a, y = rand(rows, 3 * heads * hd), rand(rows, 3 * heads * hd)
            ref, got = a.copy(), a.copy()
            bias_gelu_tanh(ref, bias, POW2)
            enc._gelu(got, bias)
            assert np.array_equal(got, ref), rows
            ref, got = np.empty_like(a), np.empty_like(a)
            layernorm(a, w, bias, 1e-6, ref)
            enc._layernorm(a, w, bias, got)
            assert np.array_equal(got, ref), rows
            ref, got = a.copy(), a.copy()
            add_bias_residual(ref, y, bias)
            enc._add_bias_residual(got, y, bias)
            assert np.array_equal(got, ref), rows
            cos, sin = rand(rows, hd // 2), rand(rows, hd // 2)
            ref = [np.empty((heads, rows, hd), np.float32) for _ in range(3)]
            got = [np.empty((heads, rows, hd), np.float32) for _ in range(3)]
            split_heads_rope(a, bias, cos, sin, *ref, 0, rows)
            enc._split_heads_rope(a, bias, cos, sin, *got)
            assert all(np.array_equal(g, r) for g, r in zip(got, ref)), rows
    finally:
        numba.set_num_threads(before)
        enc.set_weights_format("f32")


def test_q8_encode_is_the_same_on_one_and_two_threads(case, monkeypatch):
    """Element-wise rows, the products' groups and the attention's queries are split over the
    threads, each value computed as on one thread: the whole encode is bitwise the same."""
    import numba

    monkeypatch.setattr(encoder, "SERIAL_ENCODE_MACS", 0)  # the fixtures' encoders are small
    _, _, vision, prompts = case
    images = prompts[0][1]
    before = numba.get_num_threads()
    try:
        vision.set_weights_format("q8")
        outs = []
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            outs.append(vision.encode(images))
        one, two = outs
        assert np.array_equal(one.embeds, two.embeds)
        assert len(one.deepstack) == len(two.deepstack) >= 1
        assert all(np.array_equal(a, b) for a, b in zip(one.deepstack, two.deepstack))
    finally:
        numba.set_num_threads(before)
        vision.set_weights_format("f32")


def test_small_encodes_run_on_the_calling_thread_alone(case, monkeypatch):
    """An encode under SERIAL_ENCODE_MACS (patches x the matrices' weights) does not wake the
    kernel pool; a bigger one does. The same bits either way."""
    import contextlib

    _, _, vision, prompts = case
    images = prompts[0][1]
    entered = []

    @contextlib.contextmanager
    def recording():
        entered.append(True)
        with one_thread():
            yield

    monkeypatch.setattr(encoder, "one_thread", recording)
    patches = sum(len(im.pixel_values) for im in images)
    per_patch = vision.encoder._weights_per_patch
    try:
        vision.set_weights_format("q8")
        monkeypatch.setattr(encoder, "SERIAL_ENCODE_MACS", patches * per_patch + 1)
        serial = vision.encode(images)
        assert entered == [True]
        monkeypatch.setattr(encoder, "SERIAL_ENCODE_MACS", patches * per_patch)
        pooled = vision.encode(images)
        assert entered == [True]
    finally:
        vision.set_weights_format("f32")
    assert np.array_equal(serial.embeds, pooled.embeds)
    assert all(np.array_equal(a, b) for a, b in zip(serial.deepstack, pooled.deepstack))


def test_a_matrix_of_an_odd_width_stays_f32_in_the_q8_encoder(tmp_path):
    """Qwen3-VL-8B's encoder has an MLP of 4,304 (fc2 reads 4,304 columns, not a multiple of
    the 32-wide blocks): the whole encoder had fallen back to f32 (and `--vision-weights q8`
    was refused). Now every other matrix runs q8 and fc2 stays f32."""
    from dataclasses import replace

    from merlin.engine import demo

    spec = replace(demo.DEMO, name="odd-mlp", vision={**demo.DEMO_VISION, "intermediate_size": 72})
    folder = tmp_path / "odd"
    demo._build(folder, spec)
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt:
        vision = load_vision(folder, ckpt, cfg)
        vision.set_weights_format(None)  # the default
        assert vision.weights_format == "q8"
        image = vision.prepare(IMAGES / IMAGE_TABLE["wide"]["file"])
        q8 = vision.encode([image])
        blocks = vision.encoder.w.blocks
        assert all(getattr(b.fc2_w, "q8", None) is None for b in blocks)
        assert all(getattr(b.fc1_w, "q8", None) is not None for b in blocks)
        vision.set_weights_format("f32")
        f32 = vision.encode([image])
    assert cosine(q8.embeds, f32.embeds) >= 0.999
    for a, b in zip(q8.deepstack, f32.deepstack, strict=True):
        assert cosine(a, b) >= 0.999
