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
    """In place, as transformers: seen tokens' positive logits / penalty, negative * penalty."""
    if penalty == 1.0 or len(history) == 0:
        return
    seen = np.unique(np.asarray(history, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < logits.shape[0])]
    vals = logits[seen]
    logits[seen] = np.where(vals > 0, vals / penalty, vals * penalty)


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params.validate()
        self.rng = np.random.default_rng(params.seed)

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """Final distribution over the vocabulary: [V] float64, zeros outside the kept set.
        For greedy decoding, a one-hot on the argmax."""
        p = self.params
        z = np.array(logits, dtype=np.float64)
        apply_repetition_penalty(z, history, p.repetition_penalty)
        if p.greedy:
            out = np.zeros_like(z)
            out[int(np.argmax(z))] = 1.0
            return out
        with np.errstate(over="ignore"):  # a tiny temperature: the others go to -inf
            z = (z - z.max()) / p.temperature  # max first: no inf - inf, whatever temperature
        keep = np.ones(z.shape, bool)
        if 0 < p.top_k < z.shape[0]:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            keep &= z >= kth
        z = np.where(keep, z, -np.inf)
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            cut = int(np.searchsorted(cum, p.top_p, side="left")) + 1
            drop = order[cut:]
            probs[drop] = 0.0
        if p.min_p > 0:
            probs[probs < p.min_p * probs.max()] = 0.0
        return probs / probs.sum()

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.params.greedy and self.params.repetition_penalty == 1.0:
            return int(np.argmax(logits))
        return self.draw(self.probs(logits, history))

    def draw(self, probs: np.ndarray) -> int:
        """One token from a distribution, by inverse CDF with this sampler's RNG."""
        cdf = np.cumsum(probs)
        u = self.rng.random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))
