"""The conversation a session holds: messages, their images, and the events a turn adds.

Plain data with JSON forms (saved sessions store messages as JSON). An assistant message keeps
the token ids it was generated as (`ids`): the next prompt uses them instead of encoding the
text again (engine.prompt.build_prompt), so the KV rows of an answer are reused even when the
model's tokenization is not the canonical one. `key()` leaves the ids out: the app sends the
conversation as text, and a message with the same text is the same message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class SessionImage:
    """An image of a conversation. hash: SHA-256 of the prepared pixels and grid, so the same
    picture at another pixel budget is another image. prepared: the pixels (dropped once the
    embedding is cached; re-prepared from `source` if ever needed again). budget: the pixel
    budget it was prepared with (None: the checkpoint's default)."""

    hash: str
    grid_thw: tuple[int, int, int]
    merge_size: int
    source: str = ""
    prepared: object | None = field(default=None, repr=False, compare=False)
    budget: int | None = None

    @property
    def n_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size * self.merge_size)

    def to_json(self) -> dict:
        return {
            "hash": self.hash,
            "grid_thw": list(self.grid_thw),
            "merge_size": self.merge_size,
            "source": self.source,
            "budget": self.budget,
        }

    @classmethod
    def from_json(cls, d: dict) -> SessionImage:
        budget = d.get("budget")
        return cls(
            str(d["hash"]),
            tuple(int(v) for v in d["grid_thw"]),
            int(d["merge_size"]),
            str(d.get("source", "")),
            budget=None if budget is None else int(budget),
        )


@dataclass(frozen=True)
class Message:
    """One turn. images (user turns only): file paths, PIL images, PreparedImage or
    SessionImage; the session turns them into SessionImage. ids (assistant turns only): the
    token ids the answer was generated as, when known (None: encode the text). reasoning
    (assistant turns of a thinking model): the text of its `<think>` block, kept apart from
    the answer (None: no block); like ids it is not part of key(). image_offsets (user turns):
    where each image sits in the text, a character offset per image, nondecreasing (an
    OpenAI request's parts in their order: image k goes before text[offsets[k]:]); None: all
    at 0, the images before the text (how the app sends a message)."""

    role: str  # "user" | "assistant"
    text: str
    images: list = field(default_factory=list)
    ids: list[int] | None = None
    reasoning: str | None = None
    image_offsets: tuple[int, ...] | None = None

    @classmethod
    def user(
        cls, text: str, images: Iterable = (), image_offsets: Sequence[int] | None = None
    ) -> Message:
        offsets = None if image_offsets is None else tuple(int(o) for o in image_offsets)
        return cls("user", text, list(images), image_offsets=offsets)

    @classmethod
    def assistant(
        cls, text: str, ids: Sequence[int] | None = None, reasoning: str | None = None
    ) -> Message:
        return cls("assistant", text, [], None if ids is None else [int(t) for t in ids], reasoning)

    def offsets(self) -> tuple[int, ...]:
        """Each image's character offset in the text (all 0 when image_offsets is None)."""
        if self.image_offsets is None:
            return (0,) * len(self.images)
        return self.image_offsets

    def key(self) -> tuple:
        return (
            self.role,
            self.text,
            tuple(im.hash if isinstance(im, SessionImage) else id(im) for im in self.images),
            self.offsets(),
        )

    def to_json(self) -> dict:
        d = {
            "role": self.role,
            "text": self.text,
            "images": [im.to_json() for im in self.images],
        }
        if self.ids is not None:
            d["ids"] = list(self.ids)
        if self.reasoning is not None:
            d["reasoning"] = self.reasoning
        if self.image_offsets is not None:
            d["image_offsets"] = list(self.image_offsets)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Message:
        role, text = d["role"], d["text"]
        if role not in ("user", "assistant") or not isinstance(text, str):
            raise ValueError("bad message")
        ids = d.get("ids")
        if ids is not None:
            if role != "assistant" or not all(isinstance(t, int) for t in ids):
                raise ValueError("bad message ids")
            ids = list(ids)
        reasoning = d.get("reasoning")
        if reasoning is not None and (role != "assistant" or not isinstance(reasoning, str)):
            raise ValueError("bad message reasoning")
        images = [SessionImage.from_json(i) for i in d.get("images", [])]
        offsets = d.get("image_offsets")
        if offsets is not None:
            if not isinstance(offsets, list) or not all(type(o) is int for o in offsets):
                raise ValueError("bad message image_offsets")
            offsets = check_offsets(tuple(offsets), len(images), len(text))
        return cls(role, text, images, ids, reasoning, offsets)


def check_offsets(offsets: tuple[int, ...], n_images: int, n_chars: int) -> tuple[int, ...]:
    """offsets as Message.image_offsets, or ValueError: one per image, nondecreasing, each
    within the text (0..n_chars)."""
    if len(offsets) != n_images:
        raise ValueError(f"{len(offsets)} image offsets for {n_images} images")
    if any(not 0 <= o <= n_chars for o in offsets) or list(offsets) != sorted(offsets):
        raise ValueError(f"image offsets {list(offsets)} are not in order within the text")
    return offsets


@dataclass
class ContextTrimmed:
    """Event: older messages were left out of what the model sees (they stay in the chat)."""

    dropped: list[int]  # indexes into session.messages, newly left out by this turn
    # tokens the conversation shrank by (messages far past the budget, left out unrendered:
    # counted by their lower bound, session.fitting)
    dropped_tokens: int
    context_tokens: int  # tokens of the conversation the model now sees (with the question)
    notice: str  # a sentence to show in the chat


def common_prefix(a: Sequence[Message], b: Sequence[Message]) -> int:
    """How many messages a and b share from the start (same role, text and images)."""
    n = 0
    for x, y in zip(a, b):
        if x is not y and x.key() != y.key():
            break
        n += 1
    return n


def adopt_ids(known: Sequence[Message], messages: Sequence[Message]) -> list[Message]:
    """`messages` with each answer of their common prefix with `known` carrying the ids
    `known` has for it (the app sends text only; the session remembers the ids), and its
    reasoning when the message has none."""
    out = list(messages)
    for i in range(common_prefix(known, messages)):
        m, k = out[i], known[i]
        if m.role != "assistant":
            continue
        ids = m.ids if m.ids is not None else k.ids
        reasoning = m.reasoning if m.reasoning is not None else k.reasoning
        if ids is not m.ids or reasoning is not m.reasoning:
            out[i] = Message(m.role, m.text, list(m.images), ids and list(ids), reasoning)
    return out
