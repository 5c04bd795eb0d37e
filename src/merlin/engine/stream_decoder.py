"""Streaming detokenization: token ids in, only newly completed text out (never half a UTF-8
character). Used by engine.generate for every answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class StreamDecoder:
    """Incremental detokenizer: `push(id)` returns only newly completed text.

    Byte-level BPE tokens can end inside a multi-byte UTF-8 character (Chinese, emoji); the
    decoded text then ends with U+FFFD. That tail is held back until a later token completes
    it, or until `flush()`. Each push decodes only a small window: the ids since the last
    point where the text ended cleanly, plus one id before it as context (decoders such as
    SentencePiece's drop a leading space on the first token).

    Special tokens (e.g. `<think>`, `<tool_call>`) are shown as their strings so the app can
    recognise and style them; with `skip_special=True` they are dropped. End-of-turn tokens
    are the caller's business and should never be pushed. The concatenation of all pushes
    and the flush equals `tokenizer.decode(all_ids, skip_special)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._window: list[int] = []  # ids: [context id] + ids since the text last ended cleanly
        self._emitted = 0  # characters of decode(window) already returned

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        if self._skip_special and self._tok.is_special(token_id):
            return ""
        self._window.append(token_id)
        text = self._tok.decode(self._window)
        if text.endswith("\ufffd"):
            # Incomplete character at the end (a genuine U+FFFD goes out once text follows it).
            stable = len(text.rstrip("\ufffd"))
            out = text[self._emitted : stable] if stable > self._emitted else ""
            self._emitted = max(self._emitted, stable)
            return out
        out = text[self._emitted :]
        # Clean end: restart the window with the last id as context.
        self._window = self._window[-1:]
        self._emitted = len(self._tok.decode(self._window))
        return out

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes to U+FFFD); resets."""
        text = self._tok.decode(self._window) if self._window else ""
        out = text[self._emitted :]
        self._window = []
        self._emitted = 0
        return out
