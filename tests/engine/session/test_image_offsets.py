"""A user turn's images at their places in its text (Message.image_offsets): an OpenAI
request's parts [text, image, text] render as the chat template renders that content list,
not as the app's images-first turn; offsets survive JSON, the session's text checks and
its prefix reuse (key)."""

from __future__ import annotations

import pytest
from PIL import Image

from merlin.engine.errors import InputError
from merlin.engine.prompt import build_prompt, offsets_after_check, user_content
from merlin.engine.session import Message, Session, SessionImage


def test_user_content_puts_each_image_before_the_text_at_its_offset():
    assert user_content("Compare  and ", 2, (8, 13)) == [
        {"type": "text", "text": "Compare "},
        {"type": "image"},
        {"type": "text", "text": " and "},
        {"type": "image"},
    ]
    # the app's turn (no offsets) and offsets all 0 render alike: images, then the text
    assert user_content("Hi", 2) == user_content("Hi", 2, (0, 0))[:2] + [
        {"type": "text", "text": "Hi"}
    ]
    assert user_content("", 1, (0,)) == [{"type": "image"}]


def test_offsets_move_with_a_surrogate_pair_the_check_joins():
    raw = "a\ud83d\ude00b"  # a UTF-16 pair left in a str: one character once checked
    assert offsets_after_check(raw, (0, 1, 3, 4)) == (0, 1, 2, 3)


def test_offsets_are_part_of_the_key_and_the_json():
    picture = SessionImage("ab" * 16, (1, 4, 4), 2)
    first = Message.user("What is this?", [picture])
    same = Message.user("What is this?", [picture], image_offsets=(0,))
    after = Message.user("What is this?", [picture], image_offsets=(13,))
    assert first.key() == same.key() != after.key()
    assert "image_offsets" not in first.to_json()
    assert Message.from_json(after.to_json()) == after
    with pytest.raises(ValueError, match="1 image offsets for 0 images"):
        Message.from_json(dict(after.to_json(), images=[]))
    for bad in ([14], [-1], "0", [True], [0, 0]):
        with pytest.raises(ValueError):
            Message.from_json(dict(after.to_json(), image_offsets=bad))


def test_the_prompt_follows_the_parts_order(demo_model):
    s = Session(demo_model)
    picture = s.image(Image.new("RGB", (64, 48), (200, 30, 30)))
    tok, cfg = demo_model.tokenizer, demo_model.config
    text = "What is this?"
    before = build_prompt(tok, cfg, [Message.user(text, [picture])])
    after = build_prompt(tok, cfg, [Message.user(text, [picture], image_offsets=(len(text),))])
    assert sorted(before.ids) == sorted(after.ids) and before.ids != after.ids
    question = tok.encode_text(text)
    span = after.spans[0]
    # the question's tokens, then <|vision_start|> and the picture's pads
    assert after.ids[span.start - 1 - len(question) : span.start - 1] == question
    assert before.ids[before.spans[0].end + 1 :][: len(question)] == question
    assert span.end - span.start == before.spans[0].end - before.spans[0].start


def test_the_session_keeps_offsets_and_refuses_ones_that_do_not_fit(demo_model):
    s = Session(demo_model)
    picture = s.image(Image.new("RGB", (64, 48), (30, 200, 30)))
    raw = "x\ud83d\ude00 and this?"
    good = Message.user(raw, [picture], image_offsets=(3,))
    (normalized,) = s._normalize([good])
    assert normalized.text == "x\U0001f600 and this?" and normalized.image_offsets == (2,)
    for offsets in ((99,), (1, 0), ()):
        with pytest.raises(InputError, match="message 0"):
            s._normalize([Message.user("Why?", [picture] * len(offsets) or [picture],
                                       image_offsets=offsets)])  # fmt: skip
