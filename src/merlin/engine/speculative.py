"""Speculative decoding with drafts from the context itself (prompt lookup).

Drafter: the longest recent suffix of the token history (n = max..min) that occurred before
proposes the K tokens that followed it. An n-gram index is updated per accepted token, so a
draft costs microseconds whatever the context length.

Verify: one forward over [last, d1..dK] (the same entry point as decode; its rows are bitwise
equal to one-token forwards), accept the longest prefix the target agrees with, emit
accepted + 1 tokens, roll the KV cache back past the accepted prefix.

Acceptance draws each position's token exactly as plain decoding does (the sampler's next
random number, one per emitted token, on a row bitwise equal to plain decoding's) and accepts
the draft while it equals that token. So the output is identical to plain decoding, greedy
or sampled with a seed, whatever K and whenever auto mode drafts; for a deterministic draft d
the acceptance rate is p(d), that of the speculative-sampling rule (accept with p(d), else
draw from p without d), which gave the same distribution but not the same tokens.

Auto mode measures the plain step time T, the verify time V(K) and the hit rate, and drafts
only while the expected gain is positive: V(K) + overhead < T * (expected accepted + 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError

SPEC_MODES = ("off", "on", "auto")
MAX_K = 8


class Drafter:
    """n-gram index over the token history: (n-gram) -> index of the token that followed its
    most recent occurrence. Tokens in `exclude` (image pads) never start or join a match."""

    def __init__(self, n_max: int = 4, n_min: int = 2, exclude: Iterable[int] = ()):
        self.n_max, self.n_min = n_max, n_min
        self.exclude = frozenset(exclude)
        self.history: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self._clean_run = 0  # length of the current run without excluded tokens

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        h = self.history
        pos = len(h)  # index the new token gets: the continuation of the n-grams ending here
        run = self._clean_run
        for n in range(self.n_min, min(self.n_max, run) + 1):
            self.index[tuple(h[pos - n : pos])] = pos
        h.append(token)
        self._clean_run = 0 if token in self.exclude else run + 1

    def reset(self, tokens: Sequence[int]) -> None:
        self.history, self.index, self._clean_run = [], {}, 0
        self.extend(tokens)

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier match of the current suffix.
        When that continuation reaches the end of the history (the text repeats with a period
        shorter than k), it goes on through the tokens it has just proposed: the repetition
        continued, instead of a draft cut to the period (a 1-token loop drafted 1 token)."""
        h = self.history
        end = len(h)
        for n in range(min(self.n_max, self._clean_run), self.n_min - 1, -1):
            pos = self.index.get(tuple(h[end - n :]))
            if pos is not None:
                out: list[int] = []
                for i in range(k):
                    j = pos + i
                    t = h[j] if j < end else out[j - end]
                    if t in self.exclude:
                        break
                    out.append(t)
                return out
        return []


def accept(
    logits: np.ndarray, drafts: Sequence[int], sampler, history: Sequence[int]
) -> tuple[int, list[int]]:
    """logits: [K+1, V] rows of the verify forward. Each row's token is the one plain decoding
    would emit there, sampler.sample(row, tokens before it); drafts are accepted while they
    equal it. Returns (accepted count R, the R + 1 tokens to emit: the accepted drafts and the
    target's own token after them)."""
    out: list[int] = []
    penalised = sampler.params.repetition_penalty != 1.0  # else no history is read
    for i in range(len(drafts) + 1):
        out.append(sampler.sample(logits[i], [*history, *out] if penalised else ()))
        if i < len(drafts) and out[-1] != drafts[i]:
            return i, out
    return len(drafts), out


@dataclass
class SpecStats:
    """Running totals. tries: verify rounds; drafted: draft tokens proposed; hits: drafts
    accepted; kv_rolls: draft rows rolled back out of the cache; forwards/emitted give tokens
    per forward."""

    tries: int = 0
    drafted: int = 0
    hits: int = 0
    kv_rolls: int = 0
    forwards: int = 0
    emitted: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.forwards if self.forwards else 0.0

    def to_dict(self) -> dict:
        return {
            "tries": self.tries,
            "drafted": self.drafted,
            "hits": self.hits,
            "kv_rolls": self.kv_rolls,
            "hit_rate": round(self.hit_rate, 4),
            "tokens_per_forward": round(self.tokens_per_forward, 4),
        }


class SpecPolicy:
    """Decides per step whether to verify drafts and how many.

    off: never. on: always K when a match exists. auto: keeps moving averages of T (plain
    step), V(k) (verify of k drafts) and the per-draft acceptance rate a; drafts k tokens when
    max over k of (E[accepted | k] + 1) / V(k) beats 1 / T, where
    E[accepted | k] = a + a^2 + ... + a^k. a is the geometric estimate accepted drafts /
    (accepted drafts + rejections), each over a moving average: a round that accepts all k
    drafts has no rejection (the earlier (accepted + 0.5) / (k + 1) capped a at 0.9 for
    k = 4 and made auto prefer fewer drafts than were worth it). After `patience` losing
    rounds it stops drafting and re-probes every `reprobe` plain steps.
    """

    @classmethod
    def or_off(cls, mode: str, k: int) -> tuple[SpecPolicy, str | None]:
        """The policy asked for, or speculation off with the reason when it cannot be served
        (the output is the same either way; only the speed differs)."""
        try:
            return cls(mode, k), None
        except InputError as e:
            return cls("off"), f"{e} Speculative decoding is off for this answer."

    def __init__(self, mode: str = "auto", k: int = 4, patience: int = 4, reprobe: int = 16):
        if mode not in SPEC_MODES:
            raise InputError(
                f"speculative mode must be one of {', '.join(SPEC_MODES)}, got {mode!r}."
            )
        if not 1 <= k <= MAX_K:
            raise InputError(f"--spec-k must be between 1 and {MAX_K}, got {k}.")
        self.mode, self.k_max = mode, k
        self.patience, self.reprobe = patience, reprobe
        self.t_step: float | None = None
        self.t_verify: dict[int, float] = {}
        self.hits = 1.0  # moving averages of accepted drafts and of rejections per round:
        self.misses = 1.0  # the prior per-draft acceptance is 0.5
        self.losses = 0
        self.since_probe = 0

    @staticmethod
    def _ema(old: float | None, new: float, w: float = 0.25) -> float:
        return new if old is None else (1 - w) * old + w * new

    def record_step(self, seconds: float) -> None:
        self.t_step = self._ema(self.t_step, seconds)
        self.since_probe += 1

    def record_verify(self, k: int, accepted: int, seconds: float) -> None:
        self.t_verify[k] = self._ema(self.t_verify.get(k), seconds)
        self.hits = self._ema(self.hits, float(accepted), 0.2)
        self.misses = self._ema(self.misses, 1.0 if accepted < k else 0.0, 0.2)
        if self.t_step is not None:
            won = seconds < self.t_step * (accepted + 1)
            self.losses = 0 if won else self.losses + 1
        self.since_probe = 0

    @property
    def accept(self) -> float:
        """Per-draft acceptance probability (kept below 1: a long run of full hits must not
        make a single miss look impossible)."""
        return min(0.98, max(0.02, self.hits / max(self.hits + self.misses, 1e-9)))

    def _verify_time(self, k: int) -> float:
        if k in self.t_verify:
            return self.t_verify[k]
        known = sorted(self.t_verify)
        below = [j for j in known if j < k]
        above = [j for j in known if j > k]
        if below and above:  # between two measured sizes: linear
            lo, hi = below[-1], above[0]
            t_lo, t_hi = self.t_verify[lo], self.t_verify[hi]
            return t_lo + (t_hi - t_lo) * (k - lo) / (hi - lo)
        if known:  # a verify of k costs about the nearest measured one, scaled mildly
            near = min(known, key=lambda j: abs(j - k))
            return self.t_verify[near] * (1 + 0.03 * (k - near))
        return (self.t_step or 1.0) * (1 + 0.05 * k)

    def choose_k(self, n_available: int) -> int:
        """How many drafts to verify now (0 = plain step)."""
        if self.mode == "off" or n_available == 0:
            return 0
        if self.mode == "on":
            return min(self.k_max, n_available)
        if self.t_step is None:
            return 0  # measure a plain step first
        if self.losses >= self.patience:
            if self.since_probe < self.reprobe:
                return 0
            self.losses = self.patience - 1  # one probe; another loss pauses again
        a = self.accept
        best_k, best_rate = 0, 1.0 / self.t_step
        expected = 0.0
        for k in range(1, min(self.k_max, n_available) + 1):
            expected += a**k
            rate = (expected + 1) / self._verify_time(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and self.since_probe >= self.reprobe:
            return 1  # re-probe: the estimates may be stale
        return best_k
