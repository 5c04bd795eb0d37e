"""Context fitting without a model: fit_context over a fake renderer whose prompt length is
the sum of fixed per-message sizes (system prompt and generation prompt included)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from merlin.engine.errors import InputError
from merlin.engine.session import Message, fit_context

SYSTEM, TAG = 20, 3  # tokens of the system prompt, of the generation prompt


def renderer(messages, sizes, system=True):
    calls = []

    def render(dropped):
        calls.append(set(dropped))
        kept = [i for i in range(len(messages)) if i not in dropped]
        n = (SYSTEM if system else 0) + TAG + sum(sizes[i] for i in kept)
        images = [im for i in kept for im in messages[i].images]
        return SimpleNamespace(ids=[0] * n, images=images)

    return render, calls


def chat(n_turns, image_at=None):
    msgs = []
    for t in range(n_turns):
        msgs.append(Message.user(f"q{t}", ["img"] if t == image_at else []))
        msgs.append(Message.assistant(f"a{t}"))
    msgs.append(Message.user("question"))
    return msgs


def test_fits_without_dropping_and_renders_once():
    msgs = chat(3)
    render, calls = renderer(msgs, [10] * len(msgs))
    dropped, prompt, trimmed = fit_context(msgs, set(), render, budget=200, reserve=50)
    assert dropped == set() and trimmed is None and len(prompt.ids) == SYSTEM + TAG + 70
    assert calls == [set()]


def test_drops_oldest_units_down_to_the_trim_fraction():
    msgs = chat(10)  # 21 messages of 10 tokens: 233 tokens with the system prompt
    render, _ = renderer(msgs, [10] * len(msgs))
    dropped, prompt, trimmed = fit_context(
        msgs, set(), render, budget=200, reserve=20, trim_fraction=0.75, system="s"
    )
    # goal: at most 150 tokens; each unit (question + answer) is 20 tokens: 5 units go
    assert dropped == set(range(10))
    assert len(prompt.ids) == 133 <= 150
    assert trimmed.dropped == list(range(10)) and trimmed.dropped_tokens == 100
    assert trimmed.context_tokens == 133 and "10 oldest message(s)" in trimmed.notice


def test_the_latest_image_and_the_question_are_kept():
    msgs = chat(6, image_at=1)
    sizes = [10] * len(msgs)
    sizes[2] = 60  # the image turn is large
    render, _ = renderer(msgs, sizes)
    dropped, prompt, trimmed = fit_context(
        msgs, set(), render, budget=130, reserve=10, trim_fraction=0.9, system="s"
    )
    assert 2 not in dropped and 3 not in dropped  # the unit with the latest image stays
    assert len(msgs) - 1 not in dropped  # the question
    assert "latest image were kept" in trimmed.notice and len(prompt.ids) <= 120


def test_a_question_that_cannot_fit_says_what_to_do():
    msgs = chat(2)
    sizes = [10] * len(msgs)
    sizes[-1] = 500
    render, _ = renderer(msgs, sizes)
    with pytest.raises(InputError, match="needs .* tokens .*system prompt.*context budget"):
        fit_context(msgs, set(), render, budget=300, reserve=10, system="s")


def test_already_dropped_messages_stay_dropped():
    msgs = chat(4)
    render, _ = renderer(msgs, [10] * len(msgs))
    dropped, prompt, trimmed = fit_context(msgs, {0, 1}, render, budget=200, reserve=10)
    assert dropped == {0, 1} and trimmed is None and len(prompt.ids) == SYSTEM + TAG + 70
