"""Stop pressed at any moment, and faults inside the engine, on the demo checkpoint.

Cancellation (engine.generate): 120 seeded runs cancel during prefill (the event is set before
or while the prefill forward runs: it takes effect right after it), during a decode step, or
during a speculative verify (the event is set from inside the forward, as a Stop click landing
mid-computation), plus runs where a timer thread sets it at a random moment. After each:

  - the answer so far is a prefix of the uncancelled answer;
  - the KV cache holds exactly prompt + answer[:-1] (the last token was never fed) and those
    rows equal, bitwise, the rows of an uncancelled run that produced the same answer;
  - continuing the cancelled answer gives the rest of the uncancelled answer, token for token;
  - a next turn on that cache gives the same tokens as on the uncancelled one.

Faults: an exception raised inside a kernel wrapper during prefill, decode or verify reaches
the caller as that exception (the app's worker turns it into a message), the cache is left
consistent, and the same model answers the next request exactly as before.

A session-level variant (engine.session) runs the same random cancels through Session.ask.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from merlin.engine import linear, text
from merlin.engine.generate import AnswerOptions, Finished, Tokens, generate
from merlin.engine.model import load_model
from merlin.engine.prompt import chat_prompt_ids, text_prompt
from merlin.engine.sampling import SamplingParams
from merlin.engine.speculative import Drafter

GREEDY = SamplingParams(temperature=0.0)
N_NEW = 24
_models: dict = {}


def model_for(demo_dir, weights="f32", kv="f32"):
    if (weights, kv) not in _models:
        _models[weights, kv] = load_model(demo_dir, weights=weights, kv=kv)
    return _models[weights, kv]


def drafter_for(model, history):
    """A drafter that knows `history` (e.g. an earlier answer to the same question, as after a
    regenerate), so verifies run with long drafts, some of them wrong."""
    d = Drafter(exclude={model.config.image_token_id})
    d.extend(history)
    return d


def request(prompt, n=N_NEW, spec="off", k=4, start=0):
    """(prompt, options) of one generation; the prompt continues a cache of `start` rows."""
    return text_prompt(prompt, start), AnswerOptions(
        GREEDY, max_new_tokens=n, ignore_eos=True, spec=spec, spec_k=k
    )


def run(model, req, cache, cancel=None, drafter=None):
    """(emitted ids, Finished) of one generation."""
    got, done = [], None
    for event in generate(model, *req, cache=cache, cancel=cancel, drafter=drafter):
        if isinstance(event, Tokens):
            got += event.ids
        elif isinstance(event, Finished):
            done = event
    return got, done


def stored_rows(cache):
    n = cache.length
    return [cache.keys(), cache.v[:, :, :n].copy()] + (
        [cache.k_scale[:, :, :n].copy(), cache.v_scale[:, :, :n].copy()]
        if cache.fmt == "q8"
        else []
    )


class CancelInForward:
    """Sets `event` when the model's forward is called for the `at`-th time (0 = prefill), i.e.
    while that forward runs; the loop checks the event after it."""

    def __init__(self, model, event, at):
        self.model, self.event, self.at, self.calls = model, event, at, 0
        self.real = model.text.forward

    def __enter__(self):
        def forward(*args, **kwargs):
            if self.calls == self.at:
                self.event.set()
            self.calls += 1
            return self.real(*args, **kwargs)

        self.model.text.forward = forward
        return self

    def __exit__(self, *exc):
        del self.model.text.forward  # back to the class method


PROMPTS = ["Tell me about the picture.", "Write a poem about rivers.", "What is 2 + 2?"]
FOLLOW_UP = "And then?"
# f32 weights for most runs (fast); a q8 KV cache for a quarter, quantized weights for a few
CONFIGS = [("f32", "f32"), ("f32", "q8"), ("f32", "f32"), ("f32", "f32")] * 4 + [
    ("f32", "f32"),
    ("q8", "f32"),
    ("f32", "f32"),
    ("q4", "q8"),
]


@pytest.fixture(scope="module")
def references(demo_dir):
    """Per (weights, kv, prompt): the prompt ids and the uncancelled greedy answer."""
    out = {}
    for weights, kv in dict.fromkeys(CONFIGS):
        model = model_for(demo_dir, weights, kv)
        for text_ in PROMPTS:
            prompt = chat_prompt_ids(model.tokenizer, text_)
            answer, done = run(model, request(prompt), model.new_cache(256))
            assert done.reason == "max_tokens" and len(answer) == N_NEW
            out[weights, kv, text_] = (prompt, answer)
    return out


def next_turn_ids(model, answer_last: int):
    """The ids that continue a conversation after an answer: its last token (never fed), the
    end of turn and the next user turn, as a chat continues."""
    tok = model.tokenizer
    tail = tok.encode_chat([{"role": "user", "content": FOLLOW_UP}], add_generation_prompt=True)
    return [answer_last, tok.token_id("<|im_end|>"), *tok.encode_text("\n"), *tail]


def second_turn(model, cache, answer, n=8):
    ids = next_turn_ids(model, answer[-1])
    req = request(ids, n=n, start=cache.length)
    got, done = run(model, req, cache)
    assert done.reason == "max_tokens"
    return got


SEEDS = range(120)


@pytest.mark.parametrize("seed", SEEDS)
def test_cancel_at_a_random_point(demo_dir, references, seed):
    rng = random.Random(seed)
    weights, kv = CONFIGS[seed % len(CONFIGS)]  # 20 configs: 6 runs each of q8, q4
    model = model_for(demo_dir, weights, kv)
    text_ = rng.choice(PROMPTS)
    prompt, answer = references[weights, kv, text_]
    where = rng.choice(["prefill", "decode", "verify", "verify", "timer"])
    spec = "on" if where in ("verify", "timer") and rng.random() < 0.8 else "off"
    drafter = drafter_for(model, prompt + answer + [0] + prompt) if spec == "on" else None
    cancel = threading.Event()
    cache = model.new_cache(256)
    req = request(prompt, spec=spec, k=rng.choice([1, 2, 4, 8]))
    if where == "prefill":
        if rng.random() < 0.5:
            cancel.set()  # Stop before the prefill started
            got, done = run(model, req, cache, cancel, drafter)
        else:
            with CancelInForward(model, cancel, 0):  # Stop while the prefill runs
                got, done = run(model, req, cache, cancel, drafter)
        assert len(got) == 1  # the prefill's token, then nothing more
    elif where == "timer":
        timer = threading.Timer(rng.uniform(0, 0.02), cancel.set)
        timer.start()
        try:
            got, done = run(model, req, cache, cancel, drafter)
        finally:
            timer.cancel()
    else:
        with CancelInForward(model, cancel, rng.randint(1, 12)):
            got, done = run(model, req, cache, cancel, drafter)
    if done.reason == "max_tokens":  # the timer fired after the end
        assert got == answer
        return
    assert done.reason == "cancelled", done.reason
    n = len(got)
    assert 1 <= n <= N_NEW and got == answer[:n]
    assert done.token_ids == got
    # the cache holds the prompt and every emitted token but the last, nothing more
    assert cache.length == len(prompt) + n - 1 == done.cached_tokens

    # the same rows as an uncancelled run that answered exactly these n tokens (spec off)
    same = model.new_cache(256)
    got_same, done_same = run(model, request(prompt, n=n), same)
    assert got_same == got and same.length == cache.length
    for a, b in zip(stored_rows(cache), stored_rows(same)):
        assert np.array_equal(a, b)

    # continuing the answer gives the rest of the uncancelled answer
    if n < N_NEW:
        cont = model.new_cache(256)
        run(model, request(prompt, n=n), cont)
        req2 = request([got[-1]], n=N_NEW - n, start=cont.length)
        rest, _ = run(model, req2, cont)
        assert got + rest == answer

    # the next turn: the same tokens after the cancelled run as after the uncancelled one
    assert second_turn(model, cache, got) == second_turn(model, same, got)


# ---- faults inside the engine -------------------------------------------------------------------


class Boom(RuntimeError):
    pass


class FailOnCall:
    """Replace module.name (a kernel wrapper) by one that raises Boom on its `at`-th call."""

    def __init__(self, monkeypatch, module, name, at):
        self.real, self.at, self.calls = getattr(module, name), at, 0

        def wrapper(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at:
                raise Boom(f"injected into {name}")
            return self.real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)


FAULTS = [
    # (module, kernel wrapper, call that fails, spec): attention runs once per layer and
    # forward (4 layers), matmul_f32 once per small-N matrix product
    (text, "attention", 1, "off"),  # first layer of the prefill
    (text, "attention", 3, "off"),  # inside the prefill, after layers wrote their K/V
    (text, "attention", 4 * 5 + 2, "off"),  # a decode step
    (text, "attention", 4 * 3 + 4, "on"),  # a verify
    (text, "rmsnorm", 50, "on"),
    (text, "silu_mul", 30, "off"),
    (linear, "matmul_f32", 40, "on"),
]


@pytest.mark.parametrize("module,name,at,spec", FAULTS, ids=[f"{f[1]}-{f[2]}" for f in FAULTS])
def test_exception_inside_the_engine(demo_dir, references, monkeypatch, module, name, at, spec):
    model = model_for(demo_dir)
    prompt, answer = references["f32", "f32", PROMPTS[0]]
    drafter = drafter_for(model, prompt + answer + [0] + prompt) if spec == "on" else None
    cache = model.new_cache(256)
    got = []
    with monkeypatch.context() as m:
        FailOnCall(m, module, name, at)
        with pytest.raises(Boom):  # reaches the caller as it is
            for event in generate(model, *request(prompt, spec=spec), cache=cache, drafter=drafter):
                if isinstance(event, Tokens):
                    got += event.ids
    # what was emitted is right, and the cache holds only fully computed rows
    assert got == answer[: len(got)]
    assert cache.length in (0, len(prompt) + len(got) - 1)
    if cache.length:
        same = model.new_cache(256)
        run(model, request(prompt, n=len(got)), same)
        for a, b in zip(stored_rows(cache), stored_rows(same)):
            assert np.array_equal(a, b)
        # the interrupted answer continues exactly
        req = request([got[-1]], n=N_NEW - len(got), start=cache.length)
        rest, _ = run(model, req, cache)
        assert got + rest == answer
    # the model is unharmed: the next request gives the usual answer
    again, done = run(model, request(prompt), model.new_cache(256))
    assert again == answer and done.reason == "max_tokens"


def test_exception_in_the_sampler(demo_dir, references, monkeypatch):
    from merlin.engine import generate as gen_module

    model = model_for(demo_dir)
    prompt, answer = references["f32", "f32", PROMPTS[1]]
    real = gen_module.Sampler.sample
    calls = {"n": 0}

    def sample(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Boom("sampler")
        return real(self, *a, **k)

    monkeypatch.setattr(gen_module.Sampler, "sample", sample)
    with pytest.raises(Boom):
        run(model, request(prompt), model.new_cache(256))
    monkeypatch.undo()
    assert run(model, request(prompt), model.new_cache(256))[0] == answer


# ---- the same through engine.session ------------------------------------------------------------


session_mod = pytest.importorskip("merlin.engine.session")


def _answer_ids(events):
    ids, done = [], None
    for e in events:
        if isinstance(e, Tokens):
            ids += e.ids
        elif isinstance(e, Finished):
            done = e
    return ids, done


@pytest.mark.parametrize("seed", range(20))
def test_session_cancel_then_next_turn(demo_dir, seed):
    """Cancel the first answer at a random forward; the next turn's answer equals the next
    turn of a fresh session given the same conversation (the partial answer as its text)."""
    rng = random.Random(1000 + seed)
    model = model_for(demo_dir)
    spec = rng.choice(["off", "on"])
    gen = dict(sampling=GREEDY, max_new_tokens=16, ignore_eos=True, spec=spec)
    s = session_mod.Session(model)
    cancel = threading.Event()
    question = rng.choice(PROMPTS)
    with CancelInForward(model, cancel, rng.randint(0, 10)):
        first, done = _answer_ids(s.ask(question, cancel=cancel, **gen))
    assert done.reason in ("cancelled", "max_tokens")
    messages = s.messages
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].text == model.tokenizer.decode(first)
    second, _ = _answer_ids(s.ask(FOLLOW_UP, **gen))

    fresh = session_mod.Session(model)
    fresh.set_messages(messages)
    again, _ = _answer_ids(fresh.ask(FOLLOW_UP, **gen))
    assert second == again
