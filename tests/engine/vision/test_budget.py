"""The image-token budget (engine/vision/budget.py), the encoder's cost model (cost.py), the
embedding cache keyed by content hash and budget, cancel between encoder blocks, and the CLI's
--image-tokens: bad budgets get the nearest valid value, a picture too big for the context is
refused before any encoding with the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
from PIL import Image

from merlin.engine.errors import InputError
from merlin.engine.generate import Finished, Tokens
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import Session, SessionSettings
from merlin.engine.vision import budget, cost
from merlin.engine.vision.budget import BudgetedImage, InvalidBudget
from merlin.engine.vision.encoder import EncodeCancelled
from merlin.engine.vision.preprocess import PreprocessConfig

PRE = PreprocessConfig()  # Qwen3-VL's: factor 32, min 65,536 pixels, max 16,777,216
GREEDY = SamplingParams(temperature=0.0)


def photo(path, width, height, seed=0):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path)
    return path


# ---- budgets -------------------------------------------------------------------------------


def test_limits_come_from_the_checkpoint():
    assert budget.min_tokens(PRE) == 64  # 65,536 / 32^2
    assert budget.max_tokens(PRE) == 16384
    assert budget.preset_tokens("fast", PRE) == 256
    assert budget.preset_tokens("detailed", PRE) == 1024
    assert budget.preset_tokens("full", PRE) == 16384
    assert budget.preset_of(1024, PRE) == "detailed" and budget.preset_of(700, PRE) is None
    with pytest.raises(InputError, match="unknown image detail"):
        budget.preset_tokens("huge", PRE)


def test_machine_classes_have_documented_defaults():
    assert budget.machine_class(cpus=4, machine="aarch64") == "board"
    assert budget.machine_class(cpus=2, machine="x86_64") == "small"
    assert budget.machine_class(cpus=16, machine="x86_64") == "desktop"
    assert budget.default_tokens(PRE, "desktop") == 1024
    assert budget.default_tokens(PRE, "board") == 256
    tiny = PreprocessConfig(min_pixels=65536, max_pixels=131072)  # at most 128 tokens
    assert budget.default_tokens(tiny, "desktop") == 128


def test_bad_budgets_name_the_nearest_valid_value():
    with pytest.raises(InvalidBudget, match="below this model's minimum.*Use 64 or more") as e:
        budget.check_budget(10, PRE)
    assert e.value.nearest == 64
    with pytest.raises(InvalidBudget, match="at most 16,384") as e:
        budget.check_budget(20000, PRE)
    assert e.value.nearest == 16384
    with pytest.raises(InvalidBudget, match="the context holds 2,048 tokens. Use 2,047") as e:
        budget.check_budget(4096, PRE, context_tokens=2048)
    assert e.value.nearest == 2047
    with pytest.raises(InvalidBudget, match="whole number"):
        budget.check_budget(2.5, PRE)
    assert budget.check_budget(700, PRE, 8192) == 700


def test_min_pixels_is_honoured():
    # a 100x100 picture grows to min_pixels (64 tokens) whatever the budget above it
    assert budget.tokens_for(100, 100, PRE, 64) == 64
    assert budget.tokens_for(100, 100, PRE, 1024) == 64
    # a 12-megapixel photo shrinks to the budget
    assert budget.tokens_for(4000, 3000, PRE, 1024) <= 1024
    assert budget.tokens_for(4000, 3000, PRE, 256) <= 256
    assert budget.tokens_for(4000, 3000, PRE, None) > 11000  # the checkpoint's own budget


def test_a_picture_too_big_for_the_context_is_refused_with_the_numbers():
    n = budget.tokens_for(4000, 3000, PRE, None)
    with pytest.raises(InvalidBudget) as e:
        budget.check_image_fits(n, 8192, PRE, "photo.jpg")
    msg = str(e.value)
    assert f"needs {n:,} tokens; the context holds 8,192; choose 'detailed' or lower" in msg
    assert e.value.nearest == 1024
    budget.check_image_fits(1024, 8192, PRE)  # fits: no error
    # a context smaller than the smallest picture: no budget to advise ("below 0" had been)
    small = budget.min_tokens(PRE)
    with pytest.raises(InvalidBudget) as e:
        budget.check_image_fits(small, small, PRE)
    assert f"the smallest picture this model takes is {small:,} tokens" in str(e.value)
    assert "budget below" not in str(e.value)


def test_resolve_prefers_the_image_then_the_session_then_the_default():
    f2 = 32 * 32
    assert budget.resolve(PRE, 300, 1024) == (300 * f2, "t300")
    assert budget.resolve(PRE, None, 1024) == (1024 * f2, "t1024")
    assert budget.resolve(PRE, None, None, session_max_pixels=200_000) == (200_000, "px200000")
    px, tag = budget.resolve(PRE, None, None, context_tokens=300)  # the default, clamped
    assert tag == "t299" and px == 299 * f2
    with pytest.raises(InvalidBudget, match="Use 64 or more"):
        budget.resolve(PRE, 5, None, context_tokens=4096)  # a user's choice is checked
    # above the context is the picture's business (check_image_fits), not the budget's
    assert budget.resolve(PRE, 16384, None, context_tokens=4096)[1] == "t16384"


# ---- the cost model --------------------------------------------------------------------------


class _Enc:
    """The parts of a VisionEncoder the cost model reads."""

    class cfg:  # noqa: N801
        depth, hidden_size, intermediate_size = 24, 1024, 4096

    weights_format = "q8"

    def flops(self, grids):
        n = sum(t * h * w for t, h, w in grids)
        attn = sum(t * (h * w) ** 2 for t, h, w in grids) * 100.0
        return {"gemm": n * 1e6, "attn": attn, "total": n * 1e6 + attn}


class _Out:
    def __init__(self, flops, gemm_ms, attn_ms, ms):
        self.flops, self.gemm_ms, self.attn_ms, self.ms = flops, gemm_ms, attn_ms, ms


def test_cost_model_fits_measured_rates_with_the_quadratic_term(tmp_path, monkeypatch):
    monkeypatch.setenv("MERLIN_VISION_SPEED", str(tmp_path / "speed.json"))
    enc = _Enc()
    assert not cost.load_speed(enc).measured  # the prior before any measurement
    grid = [(1, 32, 32)]  # 1024 patches
    f = enc.flops(grid)
    # measured: gemm at 1e10 FLOP/s, attention at 5e9, 1 ms of other work per 1024 patches
    cost.record(
        enc,
        _Out(f, f["gemm"] / 1e7, f["attn"] / 5e6, 1.0 + f["gemm"] / 1e7 + f["attn"] / 5e6),
        1024,
    )
    speed = cost.load_speed(enc)
    gemm, attn, other = speed.rates()
    assert gemm == pytest.approx(1e10) and attn == pytest.approx(5e9)
    small = cost.estimate_seconds(enc, [(1, 16, 16)], speed)
    big = cost.estimate_seconds(enc, [(1, 64, 64)], speed)
    f_big = enc.flops([(1, 64, 64)])
    assert big == pytest.approx(f_big["gemm"] / 1e10 + f_big["attn"] / 5e9 + 4096 * other)
    assert big / small > 16  # 16x the patches: more than 16x the time (the attention)
    # a damaged cache file is only a lost cache
    (tmp_path / "speed.json").write_text("{not json")
    assert not cost.load_speed(enc).measured


# ---- sessions: budgets, cache, refusal, cancel -------------------------------------------------


def test_embeddings_are_keyed_by_content_hash_and_budget(demo_model, tmp_path):
    path = photo(tmp_path / "p.png", 640, 480)
    model = demo_model
    model.vision.embeddings = type(model.vision.embeddings)()
    s = Session(model, settings=SessionSettings(image_tokens=256))
    a = s.image(path)
    b = s.image(BudgetedImage(str(path), 64))
    c = s.image(BudgetedImage(str(path), 256))
    assert a.n_tokens <= 256 and b.n_tokens <= 64 and a.n_tokens > b.n_tokens
    assert a.hash == c.hash and a.hash != b.hash
    # the same pixels at another budget (a picture smaller than both) are another entry
    small = photo(tmp_path / "small.png", 320, 320)
    d, e = s.image(BudgetedImage(str(small), 256)), s.image(BudgetedImage(str(small), 300))
    assert d.grid_thw == e.grid_thw and d.hash != e.hash
    # encoded on attach: the answer does not encode it again, another session finds it too
    calls = []
    encode = model.vision.encode

    def counting(images, *args, **kw):
        calls.append(len(images))
        return encode(images, *args, **kw)

    model.vision.encode = counting
    try:
        s.encode_image(BudgetedImage(str(path), 64))
        assert calls == [1]
        other = Session(model, settings=SessionSettings(image_tokens=256))
        events = list(
            other.ask("what?", images=[BudgetedImage(str(path), 64)], sampling=GREEDY,
                      max_new_tokens=2)
        )  # fmt: skip
        assert calls == [1] and isinstance(events[-1], Finished)
        assert events[-1].totals["vision_ms"] < 50
    finally:
        model.vision.encode = encode


def test_a_picture_too_big_for_the_context_is_refused_before_encoding(demo_model, tmp_path):
    path = photo(tmp_path / "big.png", 1600, 1200)
    encode = demo_model.vision.encode
    demo_model.vision.encode = lambda *a, **k: pytest.fail("encoded a refused picture")
    try:
        s = Session(demo_model, settings=SessionSettings(context_budget=1024, image_tokens=16384))
        with pytest.raises(
            InvalidBudget,
            match="needs 1,900 tokens; the context holds 1,024; choose 'fast' or lower",
        ) as e:
            s.ask("what is it?", images=[path])
        assert e.value.nearest == 256
        small = Session(demo_model, settings=SessionSettings(context_budget=1024))
        with pytest.raises(InvalidBudget, match="needs 1,9"):
            small.image(BudgetedImage(str(path), 2000))
        assert small.image(BudgetedImage(str(path), 256)).n_tokens <= 256
    finally:
        demo_model.vision.encode = encode
    assert s.messages == []  # nothing of the refused turn was kept


def test_cancel_between_encoder_blocks(demo_model, tmp_path):
    vision = demo_model.vision
    image = vision.prepare(photo(tmp_path / "c.png", 320, 320), 100 * 1024)
    cancel = threading.Event()
    seen = []

    def progress(done, depth):
        seen.append((done, depth))
        cancel.set()  # Stop pressed as the encode started

    with pytest.raises(EncodeCancelled):
        vision.encode([image], cancel, progress)
    assert seen == [(0, vision.encoder.cfg.depth)]  # stopped before block 1 ran
    done = []
    out = vision.encode([image], None, lambda d, n: done.append(d))
    assert done == list(range(0, vision.encoder.cfg.depth + 1))
    assert out.embeds.shape[0] == image.n_tokens


def test_stop_during_encoding_ends_the_turn_cancelled(demo_model, tmp_path):
    demo_model.vision.embeddings = type(demo_model.vision.embeddings)()
    s = Session(demo_model, settings=SessionSettings(image_tokens=128))
    cancel = threading.Event()
    s.vision_progress = lambda done, depth: cancel.set()
    path = photo(tmp_path / "s.png", 500, 400, seed=3)
    events = list(s.ask("what?", images=[path], sampling=GREEDY, cancel=cancel))
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"
    assert not any(isinstance(e, Tokens) for e in events)
    assert demo_model.config.image_token_id not in s.token_ids  # no image rows computed
    # the next turn encodes and answers normally
    s.vision_progress = None
    events = list(s.ask("and now?", images=[path], sampling=GREEDY, max_new_tokens=2))
    assert events[-1].reason in ("max_tokens", "stop_token")


def test_stop_between_prefill_chunks(demo_model):
    s = Session(demo_model, settings=SessionSettings(warm_chunk=16))
    cancel = threading.Event()
    forward = demo_model.text.forward
    calls = []

    def spy(*args, **kwargs):
        calls.append(len(args[0]))
        cancel.set()  # Stop pressed during the first chunk
        return forward(*args, **kwargs)

    demo_model.text.forward = spy
    try:
        events = list(s.ask("word " * 100, sampling=GREEDY, cancel=cancel))
    finally:
        demo_model.text.forward = forward
    assert events[-1].reason == "cancelled" and calls == [16]


# ---- CLI --------------------------------------------------------------------------------------


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "merlin.engine.cli", *args], capture_output=True, text=True
    )


def test_cli_image_tokens(demo_dir, tmp_path):
    path = photo(tmp_path / "q.png", 900, 700)
    base = ["generate", "--model", str(demo_dir), "--temperature", "0", "--json"]
    r = _cli(*base, "--max-new-tokens", "1", "--image", str(path), "--image-tokens", "64",
             "--vision-weights", "f32", "what?")  # fmt: skip
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout.splitlines()[0])
    assert first["event"] == "prefill"
    r = _cli(*base, "--image", str(path), "--image-tokens", "10", "what?")
    assert r.returncode == 2 and "Use 64 or more" in r.stderr and "Traceback" not in r.stderr
    r = _cli(*base, "--image", str(path), "--image-tokens", "600", "--max-context", "300", "x")
    assert r.returncode == 2 and "the context holds 300 tokens. Use 299" in r.stderr
