"""Speculative decoding pieces: the drafter's index, the accept rules, the auto policy."""

import numpy as np
import pytest

from merlin.engine.errors import InputError
from merlin.engine.sampling import Sampler, SamplingParams
from merlin.engine.speculative import Drafter, SpecPolicy, accept


def naive_draft(history, k, n_max=4, n_min=2, exclude=()):
    """Longest suffix (n_max..n_min) with an earlier occurrence, most recent one wins; its
    continuation, repeated with its period where it runs into the end of the history."""
    for n in range(n_max, n_min - 1, -1):
        if len(history) < n + 1:
            continue
        suffix = history[-n:]
        if any(t in exclude for t in suffix):
            continue
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                follow = history[start + n :]  # ends at the end of the history
                out = []
                for i in range(k):
                    t = follow[i % len(follow)]
                    if t in exclude:
                        break
                    out.append(t)
                return out
    return []


def test_drafter_matches_naive_search():
    rng = np.random.default_rng(0)
    for trial in range(200):
        hist = rng.integers(0, 6, size=int(rng.integers(1, 60))).tolist()
        d = Drafter(exclude={5})
        d.extend(hist)
        assert d.draft(4) == naive_draft(hist, 4, exclude={5}), (trial, hist)


def test_drafter_proposes_repeated_phrase():
    d = Drafter()
    d.extend([1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3])
    assert d.draft(3) == [4, 5, 6]
    assert Drafter().draft(2) == []


def test_drafter_continues_a_loop_past_the_end_of_the_history():
    d = Drafter()
    d.extend([1, 2, 3, 1, 2, 3, 1, 2])
    assert d.draft(4) == [3, 1, 2, 3]  # period 3, not cut at the end
    d = Drafter()
    d.extend([7, 5, 5, 5])
    assert d.draft(4) == [5, 5, 5, 5]  # a 1-token loop drafts k tokens, not 1


def test_accept_greedy():
    logits = np.zeros((4, 10), np.float32)
    for row, tok in enumerate([3, 4, 7, 1]):
        logits[row, tok] = 1
    greedy = Sampler(SamplingParams(temperature=0.0))
    assert accept(logits, [3, 4, 5], greedy, []) == (2, [3, 4, 7])
    assert accept(logits, [3, 4, 7], greedy, []) == (3, [3, 4, 7, 1])
    assert accept(logits, [9, 4, 7], greedy, []) == (0, [3])


def test_accept_sampled_emits_what_plain_sampling_would():
    """With the same seed, the tokens accepted or drawn at each position are plain sampling's
    (one random number a token, in order): so the first token follows p exactly and a draft
    d is accepted with probability p(d)."""
    logits = np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]], np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=3)
    spec, plain = Sampler(params), Sampler(params)
    n = 20000
    first, hits = np.zeros(3), 0
    for _ in range(n):
        accepted, out = accept(logits, [1, 2], spec, [])
        expected = [plain.sample(logits[0])]
        if expected[-1] == 1:
            expected.append(plain.sample(logits[1]))
            if expected[-1] == 2:
                expected.append(plain.sample(logits[2]))
        assert out == expected and accepted == len(out) - 1
        first[out[0]] += 1
        hits += accepted > 0
    np.testing.assert_allclose(first / n, [0.5, 0.3, 0.2], atol=0.01)
    assert abs(hits / n - 0.3) < 0.01


def test_policy_modes_and_bad_values():
    assert SpecPolicy("off").choose_k(5) == 0
    assert SpecPolicy("on", k=3).choose_k(5) == 3
    assert SpecPolicy("on", k=3).choose_k(2) == 2
    with pytest.raises(InputError):
        SpecPolicy("sometimes")
    with pytest.raises(InputError):
        SpecPolicy("on", k=0)
    with pytest.raises(InputError):
        SpecPolicy("on", k=99)


def test_auto_drafts_when_it_pays_and_stops_when_it_does_not():
    p = SpecPolicy("auto", k=4)
    assert p.choose_k(4) == 0  # no measurement yet
    p.record_step(0.010)
    for _ in range(5):
        p.record_verify(4, 4, 0.011)  # cheap verify, everything accepted
    assert p.choose_k(4) >= 2
    q = SpecPolicy("auto", k=4, patience=3, reprobe=5)
    q.record_step(0.010)
    for _ in range(6):
        q.record_verify(4, 0, 0.020)  # expensive and never right
    assert q.choose_k(4) == 0
    for _ in range(5):
        q.record_step(0.010)
    assert q.choose_k(4) >= 1  # re-probes after a while


def test_auto_uses_all_drafts_when_every_draft_is_accepted():
    """Full-hit rounds carry no rejection: the acceptance estimate approaches 1 and auto
    picks K = 4 when V(4) = 2.5 T (5 tokens for 2.5 steps), not K = 2 at V(2) = 1.6 T (3 for
    1.6), which an estimate capped at 0.9 preferred."""
    p = SpecPolicy("auto", k=4)
    p.record_step(0.010)
    for _ in range(10):
        p.record_verify(2, 2, 0.016)
        p.record_verify(4, 4, 0.025)
    assert p.accept > 0.95
    assert p.choose_k(4) == 4
    for _ in range(10):  # drafts stop agreeing: the estimate falls and so does K
        p.record_verify(4, 0, 0.025)
    assert p.accept < 0.3 and p.choose_k(4) < 4
