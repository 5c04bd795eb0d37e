"""The context meter's requests and answers between the GUI and the engine thread. Qt-free.

The GUI keeps only its latest CountJob in a LatestBox and wakes the worker with a queued
signal carrying the box; the worker takes whatever is in the box when it gets to it, so a burst
of requests queued behind an answer costs one count, and a result is always for the newest
draft the GUI asked about (serial). Counting itself is engine work (engine/session/counting.py);
this module only carries plain values.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from merlin.app.model.prompting import GenerationOptions, Turn

AMBER_FRACTION = 0.85  # the meter turns amber above this share of the budget


@dataclass
class CountJob:
    serial: int
    turns: list[Turn]  # the conversation in the store, then the draft (a user turn)
    options: GenerationOptions
    conversation_id: int | None = None


@dataclass(frozen=True)
class CountReport:
    serial: int
    available: bool  # False: nothing to count with (no local model)
    tokens: int = 0
    image_tokens: int = 0
    budget: int = 0
    reserve: int = 0
    dropped: int = 0
    fits: bool = True
    problem: str = ""
    kv_bytes: int = 0  # the KV cache rows the engine session holds now (the panel's KV)

    @property
    def level(self) -> str:
        """'ok', 'amber' (above AMBER_FRACTION of the budget) or 'red' (cannot fit)."""
        if not self.fits or self.tokens + self.reserve > self.budget:
            return "red"
        if self.budget and self.tokens > AMBER_FRACTION * self.budget:
            return "amber"
        return "ok"


class LatestBox:
    """One slot, thread-safe: put() replaces what is there, take() empties it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._item = None

    def put(self, item) -> None:
        with self._lock:
            self._item = item

    def take(self):
        with self._lock:
            item, self._item = self._item, None
            return item
