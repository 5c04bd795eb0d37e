"""Turn what the user typed into prompt token ids through the checkpoint's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError, TokenizerError
from .rope import mrope_positions, text_positions
from .tokenizer import Tokenizer, clean_text, expand_image_pads

# The longest message Merlin accepts, in characters. About 32k tokens of English, 4x the
# default context budget; encoding this much takes well under a second (tests/robustness), so a
# huge paste is refused at once with a message instead of freezing the app while it tokenizes.
MAX_MESSAGE_CHARS = 128_000


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
    content = [{"type": "image"} for _ in range(n_images)]
    content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}


def chat_prompt_ids(tokenizer: Tokenizer, user_text: str, system: str | None = None) -> list[int]:
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append(user_message(user_text))
    return tokenizer.encode_chat(messages, add_generation_prompt=True)


@dataclass
class Prompt:
    """Token ids of a chat prompt with its images' pads expanded, and its 3D positions.

    positions: [3, N] int64 (t, h, w); rope_delta: decode position = cache index + rope_delta.
    images: the PreparedImage of each image, in prompt order.
    """

    ids: list[int]
    positions: np.ndarray
    rope_delta: int
    images: list = field(default_factory=list)


def build_prompt(
    tokenizer: Tokenizer,
    config,
    user_text: str,
    images: Sequence = (),
    system: str | None = None,
) -> Prompt:
    """One user turn, images first then the text (as the reference chat template renders it),
    each image's `<|image_pad|>` expanded to its t*h*w/merge**2 tokens, positions as
    transformers' get_rope_index. config: the model's ModelConfig; images: PreparedImage."""
    images = list(images)
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append(user_message(user_text, len(images)))
    ids = tokenizer.encode_chat(messages, add_generation_prompt=True)
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
    return Prompt(ids, positions, delta, images)
