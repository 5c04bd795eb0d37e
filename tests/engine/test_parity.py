"""The f32 text path against transformers' outputs stored in tests/fixtures (see
tests/make_reference.py): logits at every prompt position, greedy tokens, and cached decode
against full recompute."""

import numpy as np
import pytest
from support import REFERENCE_DIRS, load_text_model

from merlin.engine.rope import text_positions


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_fixtures_present():
    assert len(REFERENCE_DIRS) >= 3


@pytest.fixture(params=REFERENCE_DIRS, ids=lambda p: p.name, scope="module")
def case(request):
    ref = np.load(request.param / "reference.npz")
    return load_text_model(request.param), ref


def test_prompt_logits_match_transformers(case):
    model, ref = case
    ids = ref["input_ids"]
    cache = model.new_cache(256)
    logits = model.forward(ids, text_positions(0, len(ids)), cache, logits="all")
    assert logits.shape == ref["logits"].shape
    for pos in range(len(ids)):
        assert rel_err(logits[pos], ref["logits"][pos]) < 1e-4, f"position {pos}"


def test_greedy_tokens_match_transformers(case):
    model, ref = case
    ids = ref["input_ids"]
    cache = model.new_cache(256)
    logits = model.forward(ids, text_positions(0, len(ids)), cache)
    out = []
    for _ in range(len(ref["greedy_ids"])):
        token = int(np.argmax(logits[-1]))
        out.append(token)
        logits = model.forward(np.array([token]), text_positions(cache.length, 1), cache)
    assert out == ref["greedy_ids"].tolist()


def test_cached_decode_equals_full_recompute(case):
    model, ref = case
    seq = np.concatenate([ref["input_ids"], ref["greedy_ids"]])
    full = model.forward(seq, text_positions(0, len(seq)), model.new_cache(256), logits="all")
    n0 = len(ref["input_ids"])
    cache = model.new_cache(256)
    model.forward(seq[:n0], text_positions(0, n0), cache, logits="none")
    for i in range(n0, len(seq)):
        step = model.forward(seq[i : i + 1], text_positions(i, 1), cache)
        assert rel_err(step[0], full[i]) < 1e-5, f"position {i}"
