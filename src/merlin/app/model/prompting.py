"""A conversation from the chat store -> what the engine's Session needs. Qt-free.

This is the one place where the app's settings meet the engine's API. GenerationOptions (the
app's settings of a turn) map onto two engine types: SessionSettings (context budget, image
pixel budget: the session's) and AnswerOptions (sampling, max new tokens, speculative decoding:
one answer's). When the engine's API gains a parameter, it is passed on here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from merlin.engine.generate import AnswerOptions
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import Message, SessionSettings
from merlin.engine.speculative import SPEC_MODES  # noqa: F401 (the settings dialog lists them)


@dataclass
class Turn:
    """One message of the conversation as the engine sees it."""

    role: str  # "user" | "assistant"
    text: str
    images: list[str] = field(default_factory=list)  # image file paths, in order
    ids: list[int] | None = None  # an answer's token ids as generated (stored with its stats)
    reasoning: str | None = None  # a thinking model's reasoning (the template keeps or drops it)


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
    image_tokens: int = 0  # image-token budget; 0: the machine's default (engine/vision/budget)
    thinking: str = "auto"  # the chat's switch: auto (the template's default) | on | off
    thinking_budget: int = 0  # reasoning tokens before the engine closes the block; 0: no limit


def session_messages(turns: list[Turn]) -> list[Message]:
    """The stored conversation as engine session messages (images as file paths; answers
    with the ids they were generated as, so a recompute equals the cached conversation)."""
    return [
        Message(t.role, t.text, [], t.ids, t.reasoning)
        if t.role == "assistant"
        else Message(t.role, t.text, list(t.images))
        for t in turns
    ]


def session_settings(options: GenerationOptions) -> SessionSettings:
    return SessionSettings(
        context_budget=max(0, int(options.context_budget)),
        max_pixels=options.max_pixels or None,
        image_tokens=options.image_tokens or None,
    )


def sampling_params(model, options: GenerationOptions) -> SamplingParams:
    if options.sampling is None:
        return model.defaults.sampling
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    return SamplingParams(**{k: v for k, v in options.sampling.items() if k in fields}).validate()


def answer_options(model, options: GenerationOptions) -> AnswerOptions:
    """The options of one answer (engine.session.Session.respond's `options`)."""
    return AnswerOptions(
        sampling=sampling_params(model, options),
        max_new_tokens=max(1, int(options.max_new_tokens)),
        spec=options.spec_mode,
        spec_k=options.spec_k,
        thinking=options.thinking,
        thinking_budget=int(options.thinking_budget) or None,
    )
