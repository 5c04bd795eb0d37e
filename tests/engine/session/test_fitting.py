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


def test_units_far_past_the_budget_are_left_out_unrendered():
    """With a lower bound of each message's tokens, the oldest units that cannot fit whatever
    else goes are dropped before the first render: an API client's conversation of megabytes
    is not rendered (tokenized) whole, repeatedly, to find what fits."""
    msgs = chat(40)  # 81 messages of 10 tokens
    render, calls = renderer(msgs, [10] * len(msgs))
    floor = {id(m): 6 if m.role == "user" else 0 for m in msgs}  # 6 <= 10: a valid bound
    dropped, prompt, trimmed = fit_context(
        msgs, set(), render, budget=200, reserve=20, trim_fraction=0.75, system="s",
        min_tokens=lambda m: floor[id(m)],
    )  # fmt: skip
    # the question and the newest 29 questions make 180 bound tokens (the limit); with the
    # 30th newest the bound passes it: that unit and the 10 before it are never rendered
    never = set(range(22))
    assert all(never <= c for c in calls), calls
    assert len(prompt.ids) <= 150 and dropped >= never
    assert trimmed.dropped == sorted(dropped) and "oldest message(s)" in trimmed.notice
    # the same answer as without the bound (it only skips renders)
    render2, calls2 = renderer(msgs, [10] * len(msgs))
    same = fit_context(msgs, set(), render2, budget=200, reserve=20, trim_fraction=0.75, system="s")
    assert same[0] == dropped and len(same[1].ids) == len(prompt.ids)
    assert trimmed.dropped_tokens <= same[2].dropped_tokens  # the unrendered: by their bound
    assert set() in calls2  # without it, the whole conversation was rendered


def test_the_bound_never_drops_the_question_or_the_latest_image():
    msgs = chat(30, image_at=2)
    render, _ = renderer(msgs, [10] * len(msgs))
    dropped, prompt, trimmed = fit_context(
        msgs, set(), render, budget=200, reserve=20, system="s",
        min_tokens=lambda m: 10 if m.role == "user" else 0,
    )  # fmt: skip
    assert 4 not in dropped and 5 not in dropped and len(msgs) - 1 not in dropped
    assert prompt.images == ["img"] and len(prompt.ids) <= 180
