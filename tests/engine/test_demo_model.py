"""The shipped demo model: its folder is a real Qwen3-VL checkpoint, the scenes it was trained
on are what the questions say, and it answers questions about pictures the test draws, through
`merlin-cli generate --image`, in English and Chinese, with f32 and q4 weights. A broken RoPE,
image placement, DeepStack injection or kernel shows up here as a wrong colour or place."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import run_cli

from merlin.engine import demo_model as dm
from merlin.engine import demo_scenes as ds
from merlin.engine.demo import tensor_shapes

# Pictures drawn by the tests (never stored); the questions have one right answer each.
TWO = ds.Scene(
    (ds.Shape("circle", "red", "big", "left"), ds.Shape("square", "blue", "small", "right")),
    seed=101,
)
THREE = ds.Scene(
    (
        ds.Shape("triangle", "green", "small", "top"),
        ds.Shape("star", "yellow", "big", "middle"),
        ds.Shape("diamond", "purple", "small", "bottom"),
    ),
    seed=202,
)
# Each count question is asked of both pictures (two and three shapes): a model that does not
# read the picture cannot answer both right; colour and size need the shape found in it.
CASES = [
    pytest.param(TWO, "en", "What colour is the circle?", ("colour", "circle", None),
                 id="en-colour"),
    pytest.param(TWO, "en", "How many shapes are there?", ("count", None, None), id="en-count-2"),
    pytest.param(THREE, "en", "How many shapes are there?", ("count", None, None),
                 id="en-count-3"),
    pytest.param(
        THREE, "en", "Which one is bigger, the star or the diamond?", ("bigger", "star", "diamond"),
        id="en-bigger",
    ),
    pytest.param(TWO, "zh", "图片里有几个形状？", ("count", None, None), id="zh-count-2"),
    pytest.param(THREE, "zh", "图片里有几个形状？", ("count", None, None), id="zh-count-3"),
    pytest.param(TWO, "zh", "圆形是什么颜色的？", ("colour", "circle", None), id="zh-colour-2"),
    pytest.param(THREE, "zh", "三角形是什么颜色的？", ("colour", "triangle", None),
                 id="zh-colour-3"),
]  # fmt: skip


def expected(scene, lang, spec):
    kind, a, b = spec
    return ds.answer(scene, kind, lang, a, b)


# ---- the scenes ---------------------------------------------------------------------------------


def test_scenes_are_seeded_and_facts_are_unambiguous():
    for seed in range(200):
        sc = ds.scene(seed)
        assert sc == ds.scene(seed)
        assert 1 <= len(sc.shapes) <= 4
        for attr in ("kind", "colour", "position"):
            values = [getattr(s, attr) for s in sc.shapes]
            assert len(set(values)) == len(values), (seed, attr)
    a, b = ds.draw(ds.scene(7)), ds.draw(ds.scene(7))
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(ds.draw(ds.scene(8))))


def test_answers_name_the_facts_in_reading_order():
    assert expected(TWO, "en", ("colour", "circle", None)) == "The circle is red."
    assert expected(TWO, "zh", ("where", "square", None)) == "正方形在右边。"
    assert ds.answer(THREE, "shapes", "en") == "A triangle, a star and a diamond."
    assert ds.answer(THREE, "shapes", "zh") == "有一个三角形、一个星形和一个菱形。"
    assert ds.answer(THREE, "describe", "en") == (
        "There are three shapes in the picture: a small green triangle at the top, a big "
        "yellow star in the middle and a small purple diamond at the bottom."
    )
    assert ds.answer(TWO, "colour", "en", "star") == "There is no star in the picture."
    with pytest.raises(ValueError):
        ds.answer(THREE, "bigger", "en", "triangle", "diamond")  # both small: no answer
    assert not ds.can_ask(ds.Scene((ds.Shape("star", "red", "big", "top"),), 1), "bigger")


def test_drawn_colours_are_where_the_scene_says():
    """The picture holds the named colour near each shape's region centre."""
    image = np.asarray(ds.draw(TWO, 320, 240)).astype(int)
    h, w, _ = image.shape
    for shape, (fx, fy) in ((TWO.shapes[0], (0.19, 0.5)), (TWO.shapes[1], (0.81, 0.5))):
        pixel = image[int(fy * h), int(fx * w)]
        want = np.array(ds.COLOURS[shape.colour])
        assert np.abs(pixel - want).max() < 60, (shape, pixel)


def test_label_map_marks_each_shape_where_it_was_drawn():
    """draw(labels=True): the same picture, and a map whose region i + 1 holds shape i's
    colour (the training's per-token target reads it; a map off by one shape or one place
    would teach the wrong facts)."""
    for seed in range(40):
        sc = ds.scene(seed)
        image, labels = ds.draw(sc, labels=True)
        assert np.array_equal(np.asarray(image), np.asarray(ds.draw(sc)))
        assert labels.shape == (image.height, image.width) and labels.dtype == np.uint8
        pixels = np.asarray(image).astype(int)
        for i, shape in enumerate(sc.shapes):
            region = labels == i + 1
            assert region.sum() > 50, (seed, shape)
            median = np.median(pixels[region], axis=0)
            assert np.abs(median - ds.COLOURS[shape.colour]).max() < 40, (seed, shape, median)
        assert labels.max() <= len(sc.shapes)


def _train_demo_module():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "train_demo.py"
    spec = importlib.util.spec_from_file_location("train_demo", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports no torch until training starts
    return module


def test_training_token_targets_follow_the_processors_token_order():
    """scripts/train_demo.py's per-token targets: every shape owns a token, and each token a
    shape owns is one the shape covers in the processor's token order (rows 4k..4k+3 of
    pixel_values for merged token k): a picture white only where shape i is, through the same
    preprocessing, is bright exactly in the tokens shape i owns."""
    from PIL import Image

    from merlin.engine.vision.preprocess import parse_preprocess_config, prepare_pil

    train_demo = _train_demo_module()
    pre = parse_preprocess_config(train_demo.dm.PREPROCESSOR, None)
    colours = sorted(ds.COLOURS)
    for seed in range(30):
        sc = ds.scene(seed)
        _, labels = ds.draw(sc, labels=True)
        for i, shape in enumerate(sc.shapes):
            white = np.where(labels == i + 1, 255, 0).astype(np.uint8)
            only = Image.fromarray(white).convert("RGB")
            prepared = prepare_pil(only, pre)
            owners = train_demo.token_owners(sc, labels, prepared.grid_thw)
            targets = train_demo.token_targets(sc, owners)
            assert targets.shape == (len(prepared.pixel_values) // 4, 4)
            cover = prepared.pixel_values.reshape(len(targets), -1).mean(1) * 0.5 + 0.5
            owned = targets[:, 1] == colours.index(shape.colour) + 1
            assert owned.any(), (seed, shape)
            assert (targets[owned, 0] == ds.KINDS.index(shape.kind) + 1).all()
            assert (targets[owned, 2] == ds.POSITIONS.index(shape.position) + 1).all()
            assert (targets[owned, 3] == ds.SIZES.index(shape.size) + 1).all()
            assert cover[owned].min() > 0.05, (seed, shape, cover[owned])
            assert cover[~owned].max() < 0.5, (seed, shape)  # a token mostly this shape's is its


def test_training_attention_targets_point_from_the_answer_to_the_named_shape():
    """scripts/train_demo.py's attention target (--attend-weight): for a colour / where /
    bigger answer about shapes that are there, the query positions are exactly those whose
    next token is the answer's (up to its <|im_end|>), and the keys are the image pads the
    named shapes own; a question about an absent shape and the count get none. A list or
    description gets one target per shape, in reading order: the positions that predict the
    words naming that shape, looking at that shape's pads."""
    import random

    train_demo = _train_demo_module()
    enc = train_demo.Encoder(dm.shipped_dir())
    rng = random.Random(3)
    seen = {"lookup": 0, "absent": 0, "list": 0}
    for index in range(60):
        seed, turns = train_demo.make_conversation(rng, index)
        if seed is None:
            continue
        sc = ds.scene(seed)
        ids, labels, _, grid, aux, attend = enc.encode(seed, turns)
        first_pad = ids.index(enc.pad)
        targets = iter(attend)

        def owned_by(kinds, aux=aux):
            codes = {ds.KINDS.index(k) + 1 for k in kinds}
            return [i for i in range(len(aux)) if int(aux[i, 0]) in codes]

        for turn in turns:
            if turn["kind"] in train_demo.LOOKUP_KINDS:
                if not all(sc.by_kind(k) for k in turn["named"]):
                    seen["absent"] += 1
                    continue
                seen["lookup"] += 1
                q0, q1, keys = next(targets)
                answer = enc.tok.encode_text(turn["a"]) + [enc.im_end]
                assert labels[q0 + 1 : q1 + 1] == answer and labels[q0] == -100
                assert keys and all(ids[k] == enc.pad for k in keys)
                named = {ds.KINDS.index(k) + 1 for k in turn["named"]}
                kinds_there = {int(aux[k - first_pad, 0]) for k in keys}
                assert kinds_there == named, (turn, kinds_there)
                # every token of a named shape is a key, and no other
                assert sorted(k - first_pad for k in keys) == owned_by(turn["named"])
            elif turn["kind"] in ds.LIST_KINDS:
                for shape in sc.reading_order():
                    seen["list"] += 1
                    q0, q1, keys = next(targets)
                    assert -100 not in labels[q0 + 1 : q1 + 1]
                    words = enc.tok.decode(labels[q0 + 1 : q1 + 1]).lower()
                    name = shape.kind if turn["lang"] == "en" else ds._ZH_KIND[shape.kind]
                    # the words of this shape only: its kind, and no other shape's
                    assert name in words and len(words) < 40, (turn, words)
                    assert sorted(k - first_pad for k in keys) == owned_by([shape.kind])
        assert next(targets, None) is None
    assert seen["lookup"] >= 10 and seen["absent"] >= 1 and seen["list"] >= 20, seen


def test_eval_cases_are_held_out_and_askable():
    for kind in ds.QUESTION_KINDS:
        for i in range(20):
            sc, q = ds.eval_case(kind, i)
            assert sc.seed >= 10**9 and ds.can_ask(sc, kind)
            assert q.lang == ds.LANGS[i % 2] and q.answer
    assert ds.language_of("圆形是什么颜色的？") == "zh" and ds.language_of("Hello") == "en"


# ---- the shipped checkpoint ------------------------------------------------------------------


def test_shipped_folder_is_a_real_qwen3vl_checkpoint(shapes_dir):
    from merlin.engine.checkpoint import Checkpoint
    from merlin.engine.demo_model import DEMO_MODEL_NAME, chat_template, is_demo_model

    config = json.loads((shapes_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert config["text_config"]["rope_scaling"]["mrope_interleaved"] is True
    assert len(config["vision_config"]["deepstack_visual_indexes"]) == 3
    with Checkpoint(shapes_dir) as ckpt:
        names = set(ckpt.names()) if hasattr(ckpt, "names") else set(ckpt.tensors)
    assert names == set(tensor_shapes(config))
    assert (shapes_dir / "model.safetensors").stat().st_size < 20_000_000
    template = json.loads((shapes_dir / "chat_template.json").read_text())["chat_template"]
    assert template == chat_template()
    tok = json.loads((shapes_dir / "tokenizer_config.json").read_text())
    ids = {t["content"]: int(i) for i, t in tok["added_tokens_decoder"].items()}
    assert config["image_token_id"] == ids["<|image_pad|>"]
    assert is_demo_model(shapes_dir)
    assert (shapes_dir / "README.md").read_text().startswith(f"# {DEMO_MODEL_NAME}")


# ---- answers through the CLI -------------------------------------------------------------------


@pytest.mark.parametrize("weights", ["f32", "q4"])
@pytest.mark.parametrize("scene,lang,question,spec", CASES)
def test_cli_answers_questions_about_drawn_pictures(
    tmp_path, shapes_dir, weights, scene, lang, question, spec
):
    picture = tmp_path / "scene.png"
    ds.draw(scene, 320, 240).save(picture)
    r = run_cli(
        "generate", "--model", str(shapes_dir), "--weights", weights, "--image", str(picture),
        "--max-new-tokens", "40", question,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expected(scene, lang, spec), (question, r.stdout)


def test_cli_text_only_turn_gets_the_honest_answer(shapes_dir):
    r = run_cli("generate", "--model", str(shapes_dir), "--max-new-tokens", "60", "Hello!")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ds.TEXT_ONLY_ANSWER["en"]
