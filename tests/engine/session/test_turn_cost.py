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


def test_a_conversation_of_megabytes_is_fitted_without_encoding_it_whole(demo_dir):
    """An API client may send a 20 MB conversation with a context of a few thousand tokens.
    The turns that cannot fit are found by a lower bound (a text's characters over the
    longest token's) and left out unrendered: before, every step of the search for what fits
    encoded the whole conversation (12 s here), and the template's operation budget, fixed
    whatever the text's size, stopped the first render as a runaway template."""
    from merlin.engine.session import ContextTrimmed, Message

    model = load_model(demo_dir)
    tok = model.tokenizer
    msgs = []
    for i in range(220):
        words = "river lake mountain " if i % 2 else "the blue sky over a small boat "
        msgs.append(Message("assistant" if i % 2 else "user", words * 3800))
    msgs.append(Message("user", "and now?"))
    total = sum(len(m.text) for m in msgs)
    assert total > 20_000_000
    rendered = tok.render_chat([{"role": m.role, "content": m.text} for m in msgs])
    assert len(rendered) > total  # the whole of it renders: no runaway-template error

    encoded = []
    plain = tok._plain

    class Counting:
        def encode(self, text, *a, **k):
            encoded.append(len(text))
            return plain.encode(text, *a, **k)

        def __getattr__(self, name):
            return getattr(plain, name)

    tok._plain = Counting()
    try:
        session = Session(model, settings=SessionSettings(context_budget=4096))
        events = list(session.respond(msgs, max_new_tokens=2, ignore_eos=True))
    finally:
        tok._plain = plain
    trimmed = [e for e in events if isinstance(e, ContextTrimmed)]
    assert trimmed and trimmed[0].context_tokens <= 4096 - 512
    assert sum(encoded) < total // 10, sum(encoded)
