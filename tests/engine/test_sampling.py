"""Sampling: each filter does what it says, seeded runs repeat, bad values are refused."""

import warnings

import numpy as np
import pytest

from merlin.engine.errors import InputError
from merlin.engine.sampling import Sampler, SamplingParams

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0], np.float32)


def probs(**kw):
    return Sampler(SamplingParams(**kw)).probs(LOGITS)


def test_greedy_is_argmax():
    s = Sampler(SamplingParams(temperature=0.0))
    assert s.sample(LOGITS) == 5
    assert probs(temperature=0.0)[5] == 1.0


def test_temperature_softmax():
    p = probs(temperature=2.0, top_k=0, top_p=1.0)
    x = LOGITS.astype(np.float64) / 2.0
    z = np.exp(x - x.max())
    np.testing.assert_allclose(p, z / z.sum(), rtol=1e-12)


def test_top_k_keeps_k_largest():
    p = probs(temperature=1.0, top_k=2, top_p=1.0)
    assert set(np.nonzero(p)[0]) == {0, 5}


def test_top_p_keeps_smallest_prefix_reaching_p():
    full = probs(temperature=1.0, top_k=0, top_p=1.0)
    order = np.argsort(-full)
    p = probs(temperature=1.0, top_k=0, top_p=0.8)
    kept = set(np.nonzero(p)[0])
    cum = np.cumsum(full[order])
    n = int(np.searchsorted(cum, 0.8)) + 1
    assert kept == set(order[:n].tolist())
    assert abs(p.sum() - 1) < 1e-12


def test_min_p():
    full = probs(temperature=1.0, top_k=0, top_p=1.0)
    p = probs(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3)
    assert set(np.nonzero(p)[0]) == set(np.nonzero(full >= 0.3 * full.max())[0])


def test_repetition_penalty_as_transformers():
    s = Sampler(SamplingParams(temperature=0.0, repetition_penalty=4.0))
    # token 5 (3.0 -> 0.75) and token 0 (2.0 -> 0.5) penalised; token 1 (1.0) wins
    assert s.sample(LOGITS, history=[5, 0]) == 1
    # negative logits are multiplied
    s2 = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=2.0))
    p = s2.probs(LOGITS, history=[4])
    z = LOGITS.astype(np.float64).copy()
    z[4] *= 2.0
    e = np.exp(z - z.max())
    np.testing.assert_allclose(p, e / e.sum(), rtol=1e-12)


@pytest.mark.parametrize("penalty", [1e-308, 1e-200, 1e300])
def test_an_extreme_repetition_penalty_gives_a_distribution_not_nan(penalty):
    """Seen logits divided by 1e-308 had reached inf, then inf - inf made every probability
    NaN and an arbitrary token was drawn; they are now held at the largest finite value."""
    logits = np.zeros(100, np.float32)
    logits[7], logits[3] = 10.0, -5.0
    for kw in ({"temperature": 1.0, "top_k": 0, "top_p": 1.0}, {"temperature": 0.0}, {}):
        s = Sampler(SamplingParams(repetition_penalty=penalty, seed=0, **kw))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p = s.probs(logits, history=[7, 3])
            token = s.sample(logits, history=[7, 3])
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-9
        if penalty < 1:  # the seen favourite only gains
            assert token == 7 and p[7] == p.max()
        else:  # 10 / 1e300 stays above the unseen zeros (as transformers); -5 x 1e300 is out
            assert token != 3 and p[3] == 0


def test_seeded_sampling_repeats_and_follows_distribution():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=7)
    a = [Sampler(params).sample(LOGITS) for _ in range(1)]
    s1, s2 = Sampler(params), Sampler(params)
    seq1 = [s1.sample(LOGITS) for _ in range(50)]
    seq2 = [s2.sample(LOGITS) for _ in range(50)]
    assert seq1 == seq2 and a[0] == seq1[0]
    s = Sampler(params)
    counts = np.bincount([s.sample(LOGITS) for _ in range(20000)], minlength=6) / 20000
    np.testing.assert_allclose(counts, s.probs(LOGITS), atol=0.015)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(top_k=-3),
        dict(min_p=1.0),
        dict(repetition_penalty=0),
        dict(temperature=float("nan")),
        dict(temperature="0.5"),
        dict(temperature=True),
        dict(top_k=2.5),
        dict(top_p=None),
        dict(seed=-1),
        dict(seed=1.5),
        dict(seed="7"),
    ],
)
def test_bad_parameters_refused(kw):
    with pytest.raises(InputError):
        Sampler(SamplingParams(**kw))


def test_a_tiny_temperature_is_nearly_greedy():
    """1e-310 (the server allows any temperature from 0 to 100): every probability had been NaN
    (z / T overflowed to inf, then inf - inf) and arbitrary tokens came out."""
    logits = np.array([1.0, 3.0, 2.5, -4.0], np.float32)
    for t in (1e-310, 1e-30, 1e-8):
        sampler = Sampler(SamplingParams(temperature=t, top_k=0, top_p=1.0, seed=0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p = sampler.probs(logits)
        assert np.array_equal(p, [0.0, 1.0, 0.0, 0.0])
        assert all(sampler.sample(logits) == 1 for _ in range(20))


def reference_probs(logits, temperature, top_k, top_p, min_p):
    """The filters over the whole vocabulary, with a full stable sort for top-p."""
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < len(z):
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    cut = int(np.searchsorted(np.cumsum(p[order]), top_p, side="left")) + 1
    p[order[cut:]] = 0.0
    p[p < min_p * p.max()] = 0.0
    return p / p.sum()


@pytest.mark.parametrize("seed", range(6))
def test_large_vocabularies_keep_the_same_tokens_as_a_full_sort(seed):
    """Top-p sorts only the largest candidates, more until their mass reaches p: the kept set
    is the full sort's, ties at every boundary included."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(20_000) * rng.uniform(0.5, 6)).astype(np.float32)
    logits[rng.integers(0, 20_000, 2_000)] = np.round(logits.max() - 1)  # many ties
    for top_k, top_p, min_p in ((0, 0.95, 0.0), (0, 0.5, 0.0), (3000, 0.9, 0.01), (50, 0.99, 0)):
        params = SamplingParams(temperature=0.9, top_k=top_k, top_p=top_p, min_p=min_p)
        got = Sampler(params).probs(logits)
        want = reference_probs(logits, 0.9, top_k, top_p, min_p)
        assert np.array_equal(got > 0, want > 0), (top_k, top_p)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)
