"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded RNG.

Order as transformers applies them: repetition penalty -> temperature -> top-k -> top-p ->
min-p. `sample()` takes exactly one random number from the seeded RNG a token (none when
greedy without a penalty), so speculative decoding, which samples each verified position the
same way, emits what plain sampling would.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 20
    top_p: float = 0.8
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        def bad(what):
            raise InputError(what)

        def number(value) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool)

        def whole(value) -> bool:
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            if not number(getattr(self, name)):
                bad(f"{name.replace('_', ' ')} must be a number, got {getattr(self, name)!r}.")
        if not whole(self.top_k):
            bad(f"top-k must be a whole number of tokens (0: off), got {self.top_k!r}.")
        if self.seed is not None and not (whole(self.seed) and self.seed >= 0):
            bad(f"the seed must be a whole number from 0 up, or none, got {self.seed!r}.")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            bad(f"temperature must be 0 (greedy) or positive, got {self.temperature}.")
        if self.top_k < 0:
            bad(f"top-k must be 0 (off) or a positive number of tokens, got {self.top_k}.")
        if not 0 < self.top_p <= 1:
            bad(f"top-p must be in (0, 1], got {self.top_p}.")
        if not 0 <= self.min_p < 1:
            bad(f"min-p must be in [0, 1), got {self.min_p}.")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad(f"repetition penalty must be positive (1.0 = off), got {self.repetition_penalty}.")
        return self


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int], penalty: float) -> None:
    """In place, as transformers: seen tokens' positive logits / penalty, negative * penalty.
    The seen set is a mask over the vocabulary (a sort of a 32k-token history took 4 ms a
    token)."""
    if penalty == 1.0 or len(history) == 0:
        return
    ids = np.fromiter(history, dtype=np.int64, count=len(history))
    ids = ids[(ids >= 0) & (ids < logits.shape[0])]
    mask = np.zeros(logits.shape[0], bool)
    mask[ids] = True
    seen = np.flatnonzero(mask)
    vals = logits[seen]
    with np.errstate(over="ignore"):  # a penalty of 1e-300 or 1e300: held at the largest
        vals = np.where(vals > 0, vals / penalty, vals * penalty)  # finite value, so no
    big = np.finfo(logits.dtype).max  # inf - inf later (NaN probabilities)
    logits[seen] = np.clip(vals, -big, big)


class Sampler:
    """Draws tokens from the final distribution (see the module docstring for the order of
    the filters). The work is on the candidates only, the tokens top-k keeps (every token
    without it), and top-p sorts only as many of them as reach its mass: a full sort of a
    152k vocabulary took 5-19 ms a token, a third of a 2B decode step."""

    def __init__(self, params: SamplingParams):
        self.params = params.validate()
        self.rng = np.random.default_rng(params.seed)

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """Final distribution over the vocabulary: [V] float64, zeros outside the kept set.
        For greedy decoding, a one-hot on the argmax."""
        ids, p = self._candidates(logits, history)
        out = np.zeros(len(logits), np.float64)
        out[ids] = p
        return out

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token: the argmax when greedy without a penalty (no random number), else the
        inverse CDF of the final distribution at the RNG's next number (exactly one)."""
        if self.params.greedy and self.params.repetition_penalty == 1.0:
            return int(np.argmax(logits))
        ids, p = self._candidates(logits, history)
        cdf = np.cumsum(p)
        u = self.rng.random() * cdf[-1]
        return int(ids[min(np.searchsorted(cdf, u, side="right"), len(ids) - 1)])

    def rewind(self, state: dict, tokens: int) -> None:
        """Back to the RNG `state` (rng.bit_generator.state, taken before a verify), then as
        if `tokens` tokens were sampled since: a verify whose later positions were made void
        (the thinking budget closed the block there) gives their random numbers back, so
        the answer stays plain decoding's."""
        self.rng.bit_generator.state = state
        if not (self.params.greedy and self.params.repetition_penalty == 1.0):
            self.rng.random(tokens)

    def _candidates(self, logits: np.ndarray, history: Sequence[int]):
        """(token ids in increasing order, their probabilities): every token the final
        distribution gives a nonzero probability."""
        p = self.params
        z = logits  # float32 is converted exactly, so ranks and ties are the same in float64
        if p.repetition_penalty != 1.0 and len(history):
            z = np.array(logits, dtype=np.float64)
            apply_repetition_penalty(z, history, p.repetition_penalty)
        if p.greedy:
            return np.array([int(np.argmax(z))]), np.ones(1)
        if 0 < p.top_k < z.shape[0]:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            ids = np.flatnonzero(z >= kth)  # ties with the k-th are kept
            zc = z[ids].astype(np.float64)
        else:
            ids, zc = np.arange(z.shape[0]), np.array(z, dtype=np.float64)
        with np.errstate(over="ignore"):  # a tiny temperature: the others go to -inf
            zc = (zc - np.float64(z.max())) / p.temperature  # max first: no inf - inf
        probs = np.exp(zc)
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = _top_p(probs, p.top_p)
            ids, probs = ids[keep], probs[keep]
        if p.min_p > 0:
            keep = probs >= p.min_p * probs.max()
            ids, probs = ids[keep], probs[keep]
        return ids, probs / probs.sum()


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indexes (increasing) of the smallest prefix of probs, sorted by decreasing probability
    (ties in index order), whose mass reaches top_p; at least one. Only the m largest (and
    their ties) are sorted, m growing until their mass reaches top_p: the same prefix as a
    full stable sort, whose first sums are the same sequential additions."""
    m = 64
    while True:
        if m >= len(probs):
            order = np.argsort(-probs, kind="stable")
        else:
            v = np.partition(probs, -m)[-m]
            top = np.flatnonzero(probs >= v)  # every tie of the m-th too
            order = top[np.argsort(-probs[top], kind="stable")]
        cum = np.cumsum(probs[order])
        if cum[-1] >= top_p or len(order) == len(probs):
            cut = int(np.searchsorted(cum, top_p, side="left")) + 1
            return np.sort(order[:cut])
        m *= 8
