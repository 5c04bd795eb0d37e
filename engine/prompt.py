"""Turn what the user typed into prompt token ids through the checkpoint's own chat template."""

from __future__ import annotations

from .errors import InputError
from .tokenizer import Tokenizer


def user_message(text: str, n_images: int = 0) -> dict:
    """One user turn: images first, then the text, as the reference chat template renders it."""
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
