"""What the performance panel shows, computed from engine events. Qt-free.

Fed on the GUI thread with the events the worker forwards (PrefillDone, Tokens, Finished) plus
wall-clock times; the panel reads the fields a few times a second.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from merlin.engine import memory

HISTORY = 200  # forwards kept for the chart
CURRENT_WINDOW = 8  # forwards averaged for "current" tokens/s


@dataclass
class Forward:
    """One decode forward as the chart draws it."""

    gemm_ms: float
    attn_ms: float
    other_ms: float
    total_ms: float
    emitted: int
    drafted: int = 0  # speculative: drafts verified by this forward


@dataclass
class PerfStats:
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    generation: int = 0  # bumps on every change, so views repaint only when needed
    # this answer
    started_at: float | None = None
    first_token_at: float | None = None
    ttft_ms: float | None = None
    vision_ms: float = 0.0
    prefill_ms: float = 0.0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    tokens: int = 0
    decode_tokens_per_s: float | None = None  # average over the answer
    last_token_at: float | None = None
    context: int = 0
    kv_bytes: int = 0
    gb_per_s: float = 0.0
    experts_read: int = 0  # mixture of experts: experts the last forward read (all layers)
    weight_bytes: int = 0  # weight bytes the last forward read
    spec: dict = field(default_factory=dict)
    finish_reason: str = ""
    running: bool = False
    # the model (set on load)
    model_name: str = ""
    weights_fmt: str = ""
    kv_fmt: str = ""
    threads: int = 0
    spec_mode: str = ""
    spec_k: int = 0

    def _touch(self) -> None:
        self.generation += 1

    def start(self, now: float) -> None:
        self.started_at = now
        self.first_token_at = self.last_token_at = None
        self.ttft_ms = None
        self.vision_ms = self.prefill_ms = 0.0
        self.prefill_tokens = self.reused_tokens = self.tokens = 0
        self.decode_tokens_per_s = None
        self.finish_reason = ""
        self.spec = {}
        self.running = True
        self._touch()

    def prefill(self, n_tokens: int, vision_ms: float, prefill_ms: float, reused: int = 0) -> None:
        self.prefill_tokens, self.vision_ms, self.prefill_ms = n_tokens, vision_ms, prefill_ms
        self.reused_tokens = reused
        self._touch()

    def tokens_event(self, ids: list[int], profile, now: float) -> None:
        """One Tokens event: ids emitted, its StepProfile."""
        if not ids:
            return  # the detokenizer's tail: no forward behind it
        if self.first_token_at is None:
            self.first_token_at = now
            if self.started_at is not None:
                self.ttft_ms = (now - self.started_at) * 1e3
        self.last_token_at = now
        self.tokens += len(ids)
        self.context = profile.context
        self.kv_bytes = profile.kv_bytes
        self.gb_per_s = profile.gb_per_s
        self.experts_read = getattr(profile, "experts_read", 0)
        self.weight_bytes = profile.weight_bytes
        if profile.spec:
            self.spec = dict(profile.spec)
        if profile.n_tokens <= 1 or profile.spec:  # decode or verify; the prefill step is not
            self.history.append(
                Forward(
                    profile.gemm_ms,
                    profile.attn_ms,
                    profile.other_ms,
                    profile.total_ms,
                    max(profile.emitted, len(ids)),
                    int(profile.spec.get("drafted_step", profile.spec.get("k", 0)) or 0)
                    if profile.spec
                    else 0,
                )
            )
        if self.tokens > 1 and self.first_token_at is not None and now > self.first_token_at:
            self.decode_tokens_per_s = (self.tokens - 1) / (now - self.first_token_at)
        self._touch()

    def session_kv(self, kv_bytes: int) -> None:
        """The KV cache bytes of the engine session now (a chat opened or restored, between
        answers; the context meter's count reports it)."""
        if kv_bytes != self.kv_bytes:
            self.kv_bytes = int(kv_bytes)
            self._touch()

    def finished(self, reason: str, tps: float | None = None) -> None:
        """The answer ended; tps: the engine's decode rate (engine.generate.Finished)."""
        self.running = False
        self.finish_reason = reason
        if isinstance(tps, (int, float)) and tps > 0:
            self.decode_tokens_per_s = float(tps)
        self._touch()

    @property
    def current_tokens_per_s(self) -> float | None:
        """From the last few forwards' own times (what the engine sustains right now)."""
        recent = list(self.history)[-CURRENT_WINDOW:]
        ms = sum(f.total_ms for f in recent)
        return sum(f.emitted for f in recent) * 1e3 / ms if recent and ms > 0 else None

    def split_percent(self) -> tuple[float, float, float] | None:
        """Average gemm / attention / other share of the forwards in the chart, in percent."""
        total = sum(f.total_ms for f in self.history)
        if not self.history or total <= 0:
            return None
        g = sum(f.gemm_ms for f in self.history) / total * 100
        a = sum(f.attn_ms for f in self.history) / total * 100
        return g, a, max(0.0, 100 - g - a)

    def clear_history(self) -> None:
        self.history.clear()
        self._touch()


def process_memory_bytes() -> int:
    """Resident memory of this process (engine.memory.resident_memory)."""
    return memory.resident_memory()


def machine_memory_bytes() -> int | None:
    """RAM this process may use in all (engine.memory.total_memory), None if unknown."""
    return memory.total_memory()


def format_ms(ms: float | None) -> str:
    """A duration as the panel shows it: milliseconds below 10 s, else seconds ("–": none)."""
    if ms is None:
        return "–"
    return f"{ms / 1000:.2f} s" if ms >= 10_000 else f"{ms:.0f} ms"


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
