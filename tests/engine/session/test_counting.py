"""Session.count (engine/session/counting.py): the prompt tokens a turn would use equal the
PrefillDone n_tokens + reused the engine then reports, with images, after old turns are left
out, and a question that cannot fit is reported, never raised; the cache is never touched."""

from __future__ import annotations

import numpy as np
from PIL import Image

from merlin.engine.generate import PrefillDone
from merlin.engine.session import Message, Session, SessionSettings
from merlin.engine.vision.budget import BudgetedImage

GEN = dict(max_new_tokens=6, ignore_eos=True)


def _image(path, seed=1, size=(128, 96)):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return str(path)


def _prompt_tokens(events) -> int:
    done = next(e for e in events if isinstance(e, PrefillDone))
    return done.n_tokens + done.reused


def test_count_equals_the_turns_prompt_and_leaves_the_cache_alone(demo_model, tmp_path):
    s = Session(demo_model, system="Be brief.")
    pic = _image(tmp_path / "a.png")
    msgs = [Message("user", "What is in the picture?", [pic])]
    c = s.count(msgs)
    assert c.fits and c.image_tokens > 0 and c.tokens > c.image_tokens
    assert s.cached_tokens == 0 and s.messages == []
    assert _prompt_tokens(list(s.respond(msgs, **GEN))) == c.tokens
    cached, ids = s.cached_tokens, s.token_ids
    msgs = [*s.messages, Message("user", "And the colour?")]
    c2 = s.count(msgs)
    assert c2.image_tokens == 0 and c2.tokens > c.tokens
    assert s.cached_tokens == cached and s.token_ids == ids and len(s.messages) == 2
    assert _prompt_tokens(list(s.respond(msgs, **GEN))) == c2.tokens


def test_an_image_adds_its_budgeted_tokens(demo_model, tmp_path):
    s = Session(demo_model)
    pic = _image(tmp_path / "a.png", size=(640, 480))
    text = s.count([Message("user", "Describe it.")])
    small = s.count([Message("user", "Describe it.", [BudgetedImage(pic, 64)])])
    big = s.count([Message("user", "Describe it.", [BudgetedImage(pic, 256)])])
    assert 0 < small.image_tokens <= 64 < big.image_tokens <= 256
    # the image's pads plus its start/end markers
    assert small.tokens - text.tokens == small.image_tokens + 2
    assert big.tokens - small.tokens == big.image_tokens - small.image_tokens


def test_old_turns_left_out_and_a_question_that_cannot_fit(demo_model):
    s = Session(demo_model, settings=SessionSettings(context_budget=160, answer_reserve=16))
    long = "Tell me about the river, the bridge and the old town near the harbour please. "
    msgs = []
    for i in range(8):
        msgs += [Message("user", long + str(i)), Message("assistant", "It is old. " * 3)]
    c = s.count([*msgs, Message("user", "And now?")])
    assert c.fits and c.dropped > 0 and c.tokens + c.reserve <= c.budget == 160
    got = _prompt_tokens(list(s.respond([*msgs, Message("user", "And now?")], **GEN)))
    assert got == c.tokens
    huge = s.count([Message("user", long * 20)])
    assert not huge.fits and huge.tokens + huge.reserve > huge.budget
    assert "context budget" in huge.problem


def test_an_unusable_image_is_reported_not_raised(demo_model, tmp_path):
    s = Session(demo_model)
    c = s.count([Message("user", "What is it?", [str(tmp_path / "gone.png")])])
    assert not c.fits and c.tokens == 0 and "gone.png" in c.problem
    assert s.messages == [] and s.cached_tokens == 0
