"""A thinking model's reasoning as the chat shows it: the text streamed so far, when it started
and ended, and the label of its collapsed block. Qt-free (app/model/conversation.py feeds it,
widgets/reasoning_block.py shows it).

The label counts whole seconds of thinking: "Thinking… 12 s" while the block streams, "Thought
for 12 s" once the answer starts (or the answer ended inside the block). The duration is
stored with the answer (stats["thinking_s"]) so a reopened chat shows the same words.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Thought:
    """The reasoning of the answer being generated."""

    text: str = ""
    started: float | None = None  # time.monotonic() of its first token
    ended: float | None = None  # when the answer began (or the answer ended)
    dirty: bool = False  # changed since the view last showed it
    shown_label: str = field(default="", compare=False)

    @property
    def active(self) -> bool:
        """The answer has (or had) a reasoning block."""
        return self.started is not None

    def add(self, reasoning: str, answer: str, reasoning_ids: int = 0, now=None) -> None:
        """One Tokens event's parts."""
        now = time.monotonic() if now is None else now
        if (reasoning or reasoning_ids) and self.started is None:
            self.started = now
        if reasoning:
            self.text += reasoning
            self.dirty = True
        if answer and self.started is not None and self.ended is None:
            self.ended = now
            self.dirty = True

    def end(self, now=None) -> None:
        if self.started is not None and self.ended is None:
            self.ended = time.monotonic() if now is None else now
            self.dirty = True

    def seconds(self, now=None) -> float:
        if self.started is None:
            return 0.0
        stop = self.ended if self.ended is not None else (time.monotonic() if now is None else now)
        return max(0.0, stop - self.started)

    @property
    def streaming(self) -> bool:
        return self.started is not None and self.ended is None


def thinking_label(seconds: float, streaming: bool, tr=lambda text: text) -> str:
    n = int(seconds)
    if streaming:
        return tr("Thinking… {n} s").format(n=n)
    return tr("Thought for {n} s").format(n=n)


# ---- the chat's switch -------------------------------------------------------------------------


def thinking_mode(info, switch: str | None) -> str:
    """The engine's thinking mode (AnswerOptions.thinking) for a chat's switch ("on", "off",
    None: the template's default) with the loaded model (ModelInfo; None: not loaded). A
    switch stored while another model was loaded never asks thinking of a model without it."""
    if info is None or not getattr(info, "thinking", False) or switch not in ("on", "off"):
        return "auto"
    return switch


def switch_state(info, switch: str | None, tr=lambda text: text) -> tuple[bool, bool, str]:
    """(enabled, checked, tooltip) of the chat's thinking switch for the loaded model."""
    if info is None:
        return False, False, tr("Load a model first.")
    if not getattr(info, "thinking", False):
        return (
            False,
            False,
            tr(
                "This model's chat template has no thinking mode, so it always answers "
                "directly. Load a -Thinking checkpoint to see its reasoning."
            ),
        )
    checked = switch != "off"
    if getattr(info, "thinking_switchable", False):
        why = tr("The model thinks before it answers (its reasoning shows above the answer).")
    else:
        why = tr(
            "This model always thinks; switched off, Merlin closes its thinking block at once "
            "so it answers directly."
        )
    return True, checked, why


@dataclass
class ThinkingProgress:
    """What the answer's reasoning block last showed (so a flush only redraws on change)."""

    key: tuple = ()

    def changed(self, thought: Thought, now=None) -> bool:
        key = (len(thought.text), int(thought.seconds(now)), thought.streaming)
        if key == self.key:
            return False
        self.key = key
        return True
