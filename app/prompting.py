"""A conversation from the chat store -> one engine GenerationRequest. Qt-free.

This is the one place where the app's settings meet the engine's generation API: sampling,
max new tokens, context budget, speculative decoding mode and K, image pixel budget. When the
engine's API gains a parameter, it is passed on here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.generate import GenerationRequest
from engine.sampling import SamplingParams
from engine.tokenizer import expand_image_pads

SPEC_MODES = ("off", "on", "auto")


@dataclass
class Turn:
    """One message of the conversation as the engine sees it."""

    role: str  # "user" | "assistant"
    text: str
    images: list[str] = field(default_factory=list)  # image file paths, in order


@dataclass
class GenerationOptions:
    system_prompt: str = ""
    sampling: dict | None = None  # None: the checkpoint's generation_config.json
    max_new_tokens: int = 512
    context_budget: int = 8192  # tokens; 0: the model's maximum
    threads: int = 0  # 0: all
    spec_mode: str = "auto"
    spec_k: int = 4
    max_pixels: int = 0  # 0: the checkpoint's preprocessor_config.json


def engine_messages(turns: list[Turn], system_prompt: str = "") -> list[dict]:
    """Chat-template messages: images first, then the text of each user turn."""
    messages: list[dict] = []
    if system_prompt.strip():
        messages.append({"role": "system", "content": system_prompt})
    for turn in turns:
        if turn.role == "user":
            content = [{"type": "image"} for _ in turn.images]
            content.append({"type": "text", "text": turn.text})
            messages.append({"role": "user", "content": content})
        else:
            messages.append({"role": "assistant", "content": turn.text})
    return messages


def sampling_params(model, options: GenerationOptions) -> SamplingParams:
    if options.sampling is None:
        return model.defaults.sampling
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    return SamplingParams(**{k: v for k, v in options.sampling.items() if k in fields}).validate()


def build_request(
    model, turns: list[Turn], options: GenerationOptions, prepared_images: list
) -> tuple[GenerationRequest, dict]:
    """(request, keyword arguments for engine.generate.generate besides cancel).

    prepared_images: the PreparedImage of every image in turns, in order.
    """
    ids = model.tokenizer.encode_chat(engine_messages(turns, options.system_prompt))
    if prepared_images:
        ids = expand_image_pads(
            ids, model.config.image_token_id, [im.n_tokens for im in prepared_images]
        )
    request_fields = {f.name for f in dataclasses.fields(GenerationRequest)}
    extra = {}
    # Speculative decoding: passed when the engine's request has the fields (it does since
    # issue 5: GenerationRequest.spec = off|on|auto, spec_k = drafts per verify).
    for name, value in (("spec", options.spec_mode), ("spec_k", options.spec_k)):
        if name in request_fields:
            extra[name] = value
    request = GenerationRequest(
        prompt_ids=ids,
        sampling=sampling_params(model, options),
        max_new_tokens=max(1, int(options.max_new_tokens)),
        images=list(prepared_images),
        **extra,
    )
    kwargs = {"max_context": options.context_budget or None}
    return request, kwargs
