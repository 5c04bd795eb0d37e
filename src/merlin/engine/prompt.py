"""What the user typed, and the conversation around it, -> the Prompt the model computes.

One builder (build_prompt) for the CLI's one-shot prompt, the session's whole conversation and
the warm-up: the chat template renders it, image pads are expanded, 3D positions and the rope
delta computed, image spans recorded with their content hash. The checks on what a person
typed (sanitize_user_text, check_user_text) live here too, so every path applies them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .errors import InputError, TokenizerError
from .prompt_pads import expand_image_pads
from .rope import mrope_positions, text_positions
from .tokenizer import Tokenizer, clean_text

# The longest message Merlin accepts, in characters. About 32k tokens of English, 4x the
# default context budget; encoding this much takes well under a second (tests/robustness), so a
# huge paste is refused at once with a message instead of freezing the app while it tokenizes.
MAX_MESSAGE_CHARS = 128_000
# The most pictures one message takes (Session refuses more when asked; session_check reads
# no more), so a conversation never grows into a session file its own reader refuses.
MAX_IMAGES_PER_MESSAGE = 64


def sanitize_user_text(text: str | bytes) -> str:
    """Text as typed, pasted or read from a file -> text the tokenizer can always encode.

    bytes are decoded as UTF-8 with each invalid sequence replaced by U+FFFD; in a str, lone
    surrogates (a clipboard with broken UTF-16, a `surrogateescape`-decoded byte) become
    U+FFFD and a surrogate pair becomes the character it encodes. Everything else, special-token
    strings included, is kept as it is (the tokenizer makes those plain text)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        raise InputError(f"a message must be text, got {type(text).__name__}.")
    return clean_text(text)


def check_user_text(text: str | bytes) -> str:
    """sanitize_user_text, then refuse a message longer than MAX_MESSAGE_CHARS."""
    text = sanitize_user_text(text)
    if len(text) > MAX_MESSAGE_CHARS:
        raise InputError(
            f"the message is {len(text):,} characters long; Merlin accepts at most "
            f"{MAX_MESSAGE_CHARS:,} characters (about {MAX_MESSAGE_CHARS // 4:,} tokens) per "
            "message. Shorten it or send it in parts."
        )
    return text


def user_message(text: str, n_images: int = 0) -> dict:
    """One user turn: images first, then the text, as the reference chat template renders it.
    The text goes through check_user_text (InputError when too long)."""
    text = check_user_text(text)
    if not text.strip() and n_images == 0:
        raise InputError("the message is empty; type a question first.")
    return {"role": "user", "content": user_content(text, n_images)}


def user_content(text: str, n_images: int, offsets: Sequence[int] | None = None) -> list[dict]:
    """A user turn's template content: image k before text[offsets[k]:] (offsets
    nondecreasing, an OpenAI request's parts in their order); None: the images, then the
    text (how the app sends a message)."""
    if offsets is None:
        return [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    content, at = [], 0
    for offset in offsets:
        if offset > at:
            content.append({"type": "text", "text": text[at:offset]})
            at = offset
        content.append({"type": "image"})
    if text[at:] or not content:
        content.append({"type": "text", "text": text[at:]})
    return content


def offsets_after_check(raw: str, offsets: Sequence[int]) -> tuple[int, ...]:
    """Offsets into `raw` -> into check_user_text(raw) (a surrogate pair it joins into one
    character moves the offsets after it)."""
    return tuple(len(check_user_text(raw[:o])) for o in offsets)


def chat_prompt_ids(tokenizer: Tokenizer, user_text: str, system: str | None = None) -> list[int]:
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append(user_message(user_text))
    return tokenizer.encode_chat(messages, add_generation_prompt=True)


class ImageSpan(NamedTuple):
    """The rows of one image in a prompt: start..end-1 are its pads. hash: SHA-256 of its
    prepared pixels and grid (the same picture at another pixel budget is another image);
    budget: the pixel budget it was prepared with (None: the checkpoint's default)."""

    start: int
    end: int
    hash: str
    budget: int | None = None


@dataclass
class Prompt:
    """A chat prompt as the model computes it: token ids (image pads expanded), 3D positions,
    rope delta, image spans. Built once, by build_prompt; everything downstream (prefix reuse,
    prefill, decode) reads it and never renders or tokenizes again.

    positions: [3, N] int64 (t, h, w); rope_delta: decode position = cache index + rope_delta.
    images: the image of each span (PreparedImage or session image), in prompt order.
    offset: the cache index of row 0 (a prompt that continues a cache holding `offset` rows
    it does not repeat, e.g. text_prompt(ids, start=cache.length)); 0 for build_prompt.
    """

    ids: list[int]
    positions: np.ndarray
    rope_delta: int
    images: list = field(default_factory=list)
    spans: list[ImageSpan] = field(default_factory=list)
    offset: int = 0

    def __len__(self) -> int:
        return len(self.ids)


def text_prompt(ids: Sequence[int], start: int = 0, rope_delta: int = 0) -> Prompt:
    """Token ids without images (e.g. from a benchmark or a test) as a Prompt whose first
    row sits at cache index `start` (it continues a cache of `start` rows)."""
    ids = [int(t) for t in ids]
    return Prompt(ids, text_positions(start, len(ids), rope_delta), rope_delta, offset=int(start))


def image_hash(prepared, salt: str = "") -> str:
    """Content hash of a prepared image: its grid, merge size and pixels (salt: what else
    changes its embedding, e.g. the vision weights format)."""
    h = hashlib.sha256()
    h.update(repr((tuple(prepared.grid_thw), prepared.merge_size)).encode())
    if salt:
        h.update(salt.encode())
    h.update(memoryview(np.ascontiguousarray(prepared.pixel_values, np.float32)).cast("B"))
    return h.hexdigest()[:32]


def _image_key(im) -> str:
    h = getattr(im, "hash", None)
    return h if isinstance(h, str) else image_hash(im)


def _chat(system, messages, check: bool) -> tuple[list[dict], list, dict[int, list[int]]]:
    """Messages (Message-like: role, text, images, ids) -> template messages, their images
    in order, and the generated ids per template message index (assistant answers)."""
    chat = [{"role": "system", "content": system}] if system else []
    images: list = []
    answer_ids: dict[int, list[int]] = {}
    for m in messages:
        if m.role == "user":
            text = check_user_text(m.text) if check else m.text
            offsets = getattr(m, "image_offsets", None)
            if offsets is not None and text != m.text:
                offsets = offsets_after_check(m.text, offsets)
            content = user_content(text, len(m.images), offsets)
            images += list(m.images)
            chat.append({"role": "user", "content": content})
        else:
            ids = getattr(m, "ids", None)
            if ids:
                answer_ids[len(chat)] = list(ids)
            chat.append({"role": "assistant", "content": m.text})
            reasoning = getattr(m, "reasoning", None)
            if isinstance(reasoning, str):  # a thinking answer: the template keeps or drops it
                chat[-1]["reasoning_content"] = reasoning
    return chat, images, answer_ids


def build_prompt(
    tokenizer: Tokenizer,
    config,
    messages: str | Sequence,
    images: Sequence = (),
    system: str | None = None,
    *,
    generation_prompt: bool = True,
    template_kwargs: dict | None = None,
) -> Prompt:
    """The one prompt builder: (system, messages, images) through the checkpoint's chat
    template -> Prompt.

    messages: a str (one user turn with `images`, images first then the text, as the
    reference template renders it; InputError when empty or too long) or a sequence of
    conversation messages (engine.session.Message or anything with role, text, images and,
    for answers, ids). Images: PreparedImage or session images (grid_thw, merge_size,
    n_tokens; hash and budget when known). Each `<|image_pad|>` is expanded to its image's
    t*h*w/merge**2 tokens; positions as transformers' get_rope_index. An assistant message's
    `ids` (the tokens it was generated as) are used for its text wherever the template
    renders that text unchanged (Tokenizer.encode_chat's token_ids), unless they hold an
    image or video placeholder id (the model emitted one as text: its text is encoded
    instead, so the only placeholders are those of attached images); its `reasoning` (a
    thinking answer's) goes to the template as `reasoning_content`. template_kwargs: extra
    template variables (engine.thinking.template_kwargs: enable_thinking)."""
    if isinstance(messages, str):
        images = list(images)
        chat = [{"role": "system", "content": system}] if system else []
        chat.append(user_message(messages, len(images)))
        answer_ids: dict[int, list[int]] = {}
    else:
        if images:
            raise ValueError("images go in the messages when messages is a sequence")
        chat, images, answer_ids = _chat(system, messages, check=True)
        # a model can emit a placeholder id as text; re-used as an id it would claim an image
        placeholders = {config.image_token_id, config.video_token_id}
        answer_ids = {i: a for i, a in answer_ids.items() if placeholders.isdisjoint(a)}
    ids = tokenizer.encode_chat(
        chat,
        add_generation_prompt=generation_prompt,
        token_ids=answer_ids,
        **(template_kwargs or {}),
    )
    if not images:
        return Prompt(ids, text_positions(0, len(ids)), 0)
    pad = config.image_token_id
    if tokenizer.token_id("<|image_pad|>") != pad:
        raise TokenizerError(
            f"the tokenizer's <|image_pad|> is id {tokenizer.token_id('<|image_pad|>')} but "
            f"config.json says image_token_id {pad}; tokenizer and weights do not belong together."
        )
    ids = expand_image_pads(ids, pad, [im.n_tokens for im in images])
    merge = config.vision.spatial_merge_size if config.vision else images[0].merge_size
    positions, delta = mrope_positions(ids, pad, [im.grid_thw for im in images], merge)
    rows = np.flatnonzero(np.asarray(ids) == pad)
    spans, o = [], 0
    for im in images:
        s = int(rows[o])
        spans.append(ImageSpan(s, s + im.n_tokens, _image_key(im), getattr(im, "budget", None)))
        o += im.n_tokens
    return Prompt(ids, positions, delta, images, spans)
