"""A turn's work outside the model does not grow with the conversation: the messages the
session already holds are not validated or decoded again, and only the new stretches of the
prompt are BPE-encoded (the rest come from the tokenizer's memo). Counted in calls, not timed:
the calls of turn 40 equal those of turn 10 (the template render and attention over the
context are the only per-turn costs that grow, and both stop growing at the context budget)."""

from __future__ import annotations

from merlin.engine.model import load_model
from merlin.engine.session import Session, SessionSettings


class _Counted:
    """The tokenizer's BPE model, counting its encode calls."""

    def __init__(self, inner, counts):
        self._inner, self._counts = inner, counts

    def encode(self, *a, **k):
        self._counts["bpe"] += 1
        return self._inner.encode(*a, **k)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _turn_calls(session, tok, question: str) -> tuple[int, int]:
    counts = {"decode": 0, "bpe": 0}
    decode, plain = tok.decode, tok._plain

    def counted_decode(*a, **k):
        counts["decode"] += 1
        return decode(*a, **k)

    tok.decode, tok._plain = counted_decode, _Counted(plain, counts)
    try:
        for _ in session.ask(question, max_new_tokens=3, ignore_eos=True):
            pass
    finally:
        del tok.decode
        tok._plain = plain
    return counts["decode"], counts["bpe"]


def test_a_later_turn_costs_what_an_early_one_does(demo_dir):
    model = load_model(demo_dir)
    session = Session(model, settings=SessionSettings(context_budget=8192))
    tok = model.tokenizer
    calls = {}
    for turn in range(1, 41):
        question = f"question {turn} about things"
        if turn in (10, 40):
            calls[turn] = _turn_calls(session, tok, question)
        else:
            for _ in session.ask(question, max_new_tokens=3, ignore_eos=True):
                pass
    assert len(session.messages) == 80 and not session.dropped
    (decode10, bpe10), (decode40, bpe40) = calls[10], calls[40]
    assert bpe10 > 0 and bpe40 == bpe10, calls  # the new question's stretches only
    assert decode40 <= decode10 + 3, calls  # the answer's streaming (its text varies), no more
