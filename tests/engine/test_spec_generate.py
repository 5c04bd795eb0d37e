"""Speculative decoding through the real generation loop on the demo checkpoint: greedy output
byte-identical to plain decoding for every weight and KV format, rows bitwise equal, sampled
output with a seed identical to plain sampling's, statistics that add up."""

import threading

import numpy as np
import pytest

from merlin.engine.generate import AnswerOptions, Finished, Tokens, generate
from merlin.engine.model import load_model
from merlin.engine.prompt import chat_prompt_ids, text_prompt
from merlin.engine.rope import text_positions
from merlin.engine.sampling import SamplingParams
from merlin.engine.speculative import Drafter

GREEDY = SamplingParams(temperature=0.0)
_models = {}


def model_for(demo_dir, weights="f32", kv="f32"):
    if (weights, kv) not in _models:
        _models[weights, kv] = load_model(demo_dir, weights=weights, kv=kv)
    return _models[weights, kv]


def run(model, prompt, spec="off", k=4, sampling=GREEDY, n=24, drafter=None, cancel=None):
    options = AnswerOptions(sampling, max_new_tokens=n, ignore_eos=True, spec=spec, spec_k=k)
    events = list(generate(model, text_prompt(prompt), options, drafter=drafter, cancel=cancel))
    return events[-1], events


def seeded_drafter(model, prompt, answer):
    """History as after a first answer to the same question (a regenerate): the n-gram index
    knows the answer, so drafts are long and mostly right; planted fragments make the most
    recent occurrence of some 4-grams continue wrongly, so some drafts are rejected."""
    d = Drafter(exclude={model.config.image_token_id})
    d.extend(prompt + list(answer) + [0, 0])
    for i in range(4, len(answer), 3):
        d.extend(list(answer[i - 4 : i]) + [(answer[i] + 1) % 100, 0, 0])
    d.extend(prompt)
    return d


@pytest.mark.parametrize("weights,kv", [("f32", "f32"), ("f32", "q8"), ("q8", "f32"), ("q4", "q8")])
def test_greedy_spec_output_is_byte_identical(demo_dir, weights, kv):
    model = model_for(demo_dir, weights, kv)
    prompt = chat_prompt_ids(model.tokenizer, "Tell me about the picture.")
    plain, _ = run(model, prompt)
    answer = plain.token_ids
    for spec in ("on", "auto"):
        for k in (1, 4, 8):
            done, events = run(
                model, prompt, spec, k, drafter=seeded_drafter(model, prompt, answer)
            )
            assert done.token_ids == answer, (spec, k)
            assert done.text == plain.text
            s = done.spec
            if spec == "on":
                assert s["hits"] > 0 and (k == 1 or s["kv_rolls"] > 0)
                assert s["drafted"] == s["hits"] + s["kv_rolls"]
                assert s["tokens_per_forward"] > 1.0
                multi = [e for e in events if isinstance(e, Tokens) and len(e.ids) > 1]
                assert multi and all(e.profile.emitted == len(e.ids) for e in multi)
            assert done.cached_tokens == len(prompt) + len(answer) - 1


@pytest.mark.parametrize("weights,kv", [("q8", "q8"), ("q4", "f32"), ("q4", "q8")])
def test_verify_rows_bitwise_equal_decode_rows(demo_dir, weights, kv):
    model = model_for(demo_dir, weights, kv)
    ids = np.arange(3, 40)
    n0, k = 30, 7
    cache = model.new_cache(64)
    model.text.forward(ids[:n0], text_positions(0, n0), cache, logits="none")
    batch = model.text.forward(ids[n0 : n0 + k], text_positions(n0, k), cache, logits="all")
    cache.truncate(n0)
    for i in range(k):
        row = model.text.forward(ids[n0 + i : n0 + i + 1], text_positions(n0 + i, 1), cache)
        assert np.array_equal(row[0], batch[i]), f"row {i}"


@pytest.mark.parametrize("weights,kv", [("f32", "f32"), ("q4", "q8")])
def test_sampled_spec_output_is_plain_sampling_with_the_same_seed(demo_dir, weights, kv):
    """Sampled with a seed, speculation on (any K) or auto gives plain decoding's tokens, so a
    seed repeats an answer whatever auto mode measured; drafts were accepted and rejected."""
    model = model_for(demo_dir, weights, kv)
    prompt = chat_prompt_ids(model.tokenizer, "hi")
    params = dict(temperature=0.8, top_k=4, top_p=1.0, repetition_penalty=1.1)
    hits = rolls = 0
    for seed in range(12):
        sampling = SamplingParams(seed=seed, **params)
        plain, _ = run(model, prompt, sampling=sampling, n=16)
        for spec, k in (("on", 1), ("on", 3), ("on", 8), ("auto", 4)):
            drafter = seeded_drafter(model, prompt, plain.token_ids)
            done, _ = run(model, prompt, spec, k, sampling, n=16, drafter=drafter)
            assert done.token_ids == plain.token_ids, (seed, spec, k)
            hits += done.spec["hits"]
            rolls += done.spec["kv_rolls"]
    assert hits > 50 and rolls > 10


def test_cancel_during_speculation_keeps_session_consistent(demo_dir):
    model = model_for(demo_dir)
    prompt = chat_prompt_ids(model.tokenizer, "Tell me about the picture.")
    plain, _ = run(model, prompt, n=30)
    cancel = threading.Event()
    options = AnswerOptions(GREEDY, max_new_tokens=30, ignore_eos=True, spec="on", spec_k=4)
    cache = model.new_cache(256)
    got = []
    drafter = seeded_drafter(model, prompt, plain.token_ids)
    for event in generate(
        model, text_prompt(prompt), options, cache=cache, cancel=cancel, drafter=drafter
    ):
        if isinstance(event, Tokens):
            got += event.ids
            if len(got) >= 7:
                cancel.set()
        if isinstance(event, Finished):
            done = event
    assert done.reason == "cancelled"
    assert got == plain.token_ids[: len(got)]
    # the cache holds the prompt and every emitted token but the last (not fed yet)
    assert cache.length == len(prompt) + len(got) - 1
    # continuing from this cache gives the same logits as a fresh computation
    seq = np.array(prompt + got)
    fresh = model.new_cache(256)
    ref = model.text.forward(seq, text_positions(0, len(seq)), fresh)
    cont = model.text.forward(seq[-1:], text_positions(len(seq) - 1, 1), cache)
    np.testing.assert_allclose(cont, ref, rtol=1e-4, atol=1e-4)


def test_ignore_eos_counts_end_of_turn_tokens_but_never_shows_them(shapes_dir):
    """Past an end-of-turn token (ignore_eos) generation goes on, and the token is in the ids
    but not in the text (vLLM's skip of special tokens; StreamDecoder never gets one). The
    trained demo model, which ends its answers."""
    model = load_model(shapes_dir)
    prompt = chat_prompt_ids(model.tokenizer, "Hello!")
    options = AnswerOptions(GREEDY, max_new_tokens=200)
    natural = list(generate(model, text_prompt(prompt), options))[-1]
    assert natural.reason == "stop_token", "the demo model ends its answer within 200 tokens"
    n = len(natural.token_ids) + 6
    done, _ = run(model, prompt, n=n)
    eos = [t for t in done.token_ids if t in model.eos_ids]
    assert done.token_ids[: len(natural.token_ids)] == natural.token_ids and eos
    assert done.text.startswith(natural.text)
    for t in set(eos):
        assert model.tokenizer.decode([t]) not in done.text


def test_prompt_longer_than_the_context_says_what_can_be_done(demo_dir):
    """Raising the context budget is offered only while the model reads more than it."""
    from merlin.engine.errors import InputError
    from merlin.engine.generate import check_prompt

    model = model_for(demo_dir)
    limit = model.config.text.max_position_embeddings
    with pytest.raises(InputError, match="shorten it or raise the context budget"):
        check_prompt(model, [1] * 10, 8)
    with pytest.raises(InputError, match=r"all the model reads\); shorten it\.$"):
        check_prompt(model, [1] * (limit + 1), limit)
