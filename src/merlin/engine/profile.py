"""Per-forward timing split into gemm / attention / other, measured for real.

Timers are perf_counter pairs around kernel calls: a few dozen per layer, well under 2% of a
step. Everything not inside a gemm or attention span is "other" (norms, rope, activations,
sampling, detokenizing).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass
class StepProfile:
    step: int = 0
    context: int = 0  # tokens in the KV cache after this forward
    n_tokens: int = 0  # rows in this forward
    emitted: int = 0  # tokens this forward produced for the user
    gemm_ms: float = 0.0
    attn_ms: float = 0.0
    other_ms: float = 0.0
    total_ms: float = 0.0
    weight_bytes: int = 0  # weight bytes read by this forward
    kv_bytes: int = 0  # KV cache bytes read by this forward
    experts_read: int = 0  # routed experts this forward read, all layers (mixture of experts)
    spec: dict = field(
        default_factory=dict
    )  # drafted/accepted and running totals, when speculating

    @property
    def gb_per_s(self) -> float:
        return (self.weight_bytes + self.kv_bytes) / (self.total_ms * 1e6) if self.total_ms else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gb_per_s"] = round(self.gb_per_s, 3)
        return d


class StepTimer:
    """Collects gemm/attention time within one forward; total is wall time start..finish."""

    __slots__ = ("gemm", "attn", "_t0")

    def __init__(self):
        self.gemm = 0.0
        self.attn = 0.0
        self._t0 = time.perf_counter()

    def finish(self, profile: StepProfile) -> StepProfile:
        total = time.perf_counter() - self._t0
        profile.gemm_ms = self.gemm * 1e3
        profile.attn_ms = self.attn * 1e3
        profile.total_ms = total * 1e3
        profile.other_ms = max(0.0, profile.total_ms - profile.gemm_ms - profile.attn_ms)
        return profile
