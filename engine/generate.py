"""The generation loop as a stream of events (plain dataclasses, no Qt).

prefill -> sample -> [forward one token -> sample]* until a stop token, max tokens, a full
context or cancellation. Cancellation is checked between forwards, so a cancelled run keeps
everything it produced and the KV cache holds exactly the tokens that were fed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .kv_cache import KVCache
from .model import Model
from .profile import StepProfile, StepTimer
from .rope import mrope_positions, text_positions
from .sampling import Sampler, SamplingParams
from .tokenizer import StreamDecoder

FINISH_REASONS = ("stop_token", "max_tokens", "cancelled", "context_full", "error")


@dataclass
class PrefillDone:
    n_tokens: int
    vision_ms: float
    prefill_ms: float
    reused: int = 0


@dataclass
class Tokens:
    text: str
    ids: list[int]
    profile: StepProfile


@dataclass
class Finished:
    reason: str
    totals: dict = field(default_factory=dict)


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int = 512
    ignore_eos: bool = False
    positions: np.ndarray | None = None  # [3, N]; None -> text (or image) positions
    rope_delta: int = 0  # decode position = cache index + rope_delta
    images: list = field(default_factory=list)  # PreparedImage per image, in prompt order


def check_prompt(model: Model, prompt_ids: list[int], max_context: int) -> None:
    if len(prompt_ids) == 0:
        raise InputError("the prompt is empty; type a question first.")
    if len(prompt_ids) >= max_context:
        raise InputError(
            f"the prompt is {len(prompt_ids)} tokens but the context holds {max_context}; "
            "shorten it or raise the context budget."
        )
    bad = [t for t in prompt_ids if not 0 <= t < model.config.text.vocab_size]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the model's vocabulary.")


def generate(
    model: Model,
    request: GenerationRequest,
    *,
    cache: KVCache | None = None,
    max_context: int | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[PrefillDone | Tokens | Finished]:
    """Run one answer. `cache` may hold a shared prefix already (prompt_ids continue it)."""
    max_context = min(max_context or model.max_context, model.max_context)
    if cache is None:
        cache = model.new_cache(max_context)
    check_prompt(model, request.prompt_ids, max_context - cache.length)
    sampler = Sampler(request.sampling)
    stream = StreamDecoder(model.tokenizer)
    history = list(request.prompt_ids)
    generated: list[int] = []
    text_parts: list[str] = []
    bytes_per_token = model.bytes_per_token

    # prefill
    n = len(request.prompt_ids)
    positions = request.positions
    rope_delta = request.rope_delta
    if positions is None and request.images:
        positions, rope_delta = mrope_positions(
            request.prompt_ids,
            model.config.image_token_id,
            [im.grid_thw for im in request.images],
            request.images[0].merge_size,
            start=cache.length,
            delta=request.rope_delta,
        )
    if positions is None:
        positions = text_positions(cache.length, n, request.rope_delta)
    timer = StepTimer()  # the vision encoder's time shows in this step's "other"
    t0 = time.perf_counter()
    vision_ms = 0.0
    image_kw = {}
    if request.images:
        inputs = model.vision.prompt_inputs(request.prompt_ids, request.images)
        vision_ms = inputs.vision_ms
        image_kw = dict(embeds=inputs.embeds, embed_rows=inputs.rows, deepstack=inputs.deepstack)
    logits = model.text.forward(
        np.asarray(request.prompt_ids), positions, cache, timer=timer, **image_kw
    )
    prefill_ms = (time.perf_counter() - t0) * 1e3 - vision_ms
    yield PrefillDone(n_tokens=n, vision_ms=vision_ms, prefill_ms=prefill_ms)
    t_decode0 = time.perf_counter()
    reason = "max_tokens"
    step = 0
    while True:
        token = sampler.sample(logits[-1], history)
        is_eos = token in model.eos_ids and not request.ignore_eos
        text = "" if is_eos else stream.push(token)
        prof = timer.finish(
            StepProfile(
                step=step,
                context=cache.length,
                n_tokens=n if step == 0 else 1,
                emitted=1,
                weight_bytes=bytes_per_token,
                kv_bytes=cache.length * cache.bytes_per_token(),
            )
        )
        if is_eos:
            reason = "stop_token"
            break
        generated.append(token)
        history.append(token)
        text_parts.append(text)
        yield Tokens(text=text, ids=[token], profile=prof)
        step += 1
        if len(generated) >= request.max_new_tokens:
            break
        if cancel is not None and cancel.is_set():
            reason = "cancelled"
            break
        if cache.length + 1 > max_context:
            reason = "context_full"
            break
        timer = StepTimer()
        pos = text_positions(cache.length, 1, rope_delta)
        logits = model.text.forward(np.array([token]), pos, cache, timer=timer)
    tail = stream.flush()
    if tail:
        text_parts.append(tail)
        yield Tokens(text=tail, ids=[], profile=StepProfile(step=step, context=cache.length))
    decode_s = time.perf_counter() - t_decode0
    yield Finished(
        reason=reason,
        totals={
            "prompt_tokens": n,
            "generated_tokens": len(generated),
            "prefill_ms": round(prefill_ms, 3),
            "vision_ms": round(vision_ms, 3),
            "decode_ms": round(decode_s * 1e3, 3),
            "tokens_per_s": round(len(generated) / decode_s, 3) if decode_s > 0 else 0.0,
            "token_ids": generated,
            "text": "".join(text_parts),
        },
    )
