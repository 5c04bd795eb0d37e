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
from .finite import check_logits
from .kv_cache import KVCache
from .model import Model
from .profile import StepProfile, StepTimer
from .rope import mrope_positions, text_positions
from .sampling import Sampler, SamplingParams
from .speculative import Drafter, SpecPolicy, SpecStats, accept_greedy, accept_sampled
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


def event_json(event) -> dict:
    """One event as the JSON object `merlin-cli --json` prints (one per line)."""
    if isinstance(event, PrefillDone):
        return {
            "event": "prefill",
            "n_tokens": event.n_tokens,
            "reused": event.reused,
            "vision_ms": round(event.vision_ms, 3),
            "prefill_ms": round(event.prefill_ms, 3),
        }
    if isinstance(event, Tokens):
        return {
            "event": "tokens",
            "text": event.text,
            "ids": event.ids,
            "profile": event.profile.to_dict(),
        }
    return {"event": "finished", "reason": event.reason, **event.totals}


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int = 512
    ignore_eos: bool = False
    positions: np.ndarray | None = None  # [3, N]; None -> text (or image) positions
    rope_delta: int = 0  # decode position = cache index + rope_delta
    images: list = field(default_factory=list)  # PreparedImage per image, in prompt order
    spec: str = "off"  # speculative decoding: off | on | auto
    spec_k: int = 4  # drafts per verify (the maximum, in auto mode)
    # precomputed image rows (engine.vision.ImageInputs: embeds, rows, deepstack, vision_ms),
    # used instead of running the encoder on `images` (engine.session caches embeddings)
    image_inputs: object | None = None


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
    drafter: Drafter | None = None,
) -> Iterator[PrefillDone | Tokens | Finished]:
    """Run one answer. `cache` may hold a shared prefix already (prompt_ids continue it);
    `drafter` may carry the earlier history for speculative drafts."""
    max_context = min(max_context or model.max_context, model.max_context)
    if cache is None:
        cache = model.new_cache(max_context)
    check_prompt(model, request.prompt_ids, max_context - cache.length)
    policy, spec_notice = SpecPolicy.or_off(request.spec, request.spec_k)
    sampler = Sampler(request.sampling)
    exact_greedy = request.sampling.greedy and request.sampling.repetition_penalty == 1.0
    stream = StreamDecoder(model.tokenizer)
    if drafter is None:
        drafter = Drafter(exclude={model.config.image_token_id, model.config.video_token_id})
        drafter.extend(request.prompt_ids)
    history = list(request.prompt_ids)
    generated: list[int] = []
    text_parts: list[str] = []
    stats = SpecStats()
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
    vision_ms = encoder_ms = 0.0  # encoder_ms: the part of vision_ms spent in this call
    image_kw = {}
    if request.image_inputs is not None or request.images:
        inputs = request.image_inputs
        if inputs is None:
            inputs = model.vision.prompt_inputs(request.prompt_ids, request.images)
            encoder_ms = inputs.vision_ms
        vision_ms = inputs.vision_ms
        image_kw = dict(embeds=inputs.embeds, embed_rows=inputs.rows, deepstack=inputs.deepstack)
    prompt_start = cache.length
    logits = model.text.forward(
        np.asarray(request.prompt_ids), positions, cache, timer=timer, **image_kw
    )
    check_logits(logits, cache, prompt_start, "the prompt")  # NaN/inf: stop with a message
    prefill_ms = (time.perf_counter() - t0) * 1e3 - encoder_ms
    yield PrefillDone(n_tokens=n, vision_ms=vision_ms, prefill_ms=prefill_ms)
    t_decode0 = time.perf_counter()
    stats.forwards = 1
    reason = None
    step = 0
    new_tokens = [sampler.sample(logits[-1], history)]  # decided by the last forward
    rows, drafted, accepted, round_start = n, 0, 0, 0
    while True:
        # emit what the last forward decided, up to a stop token or the token budget
        emit = []
        for token in new_tokens:
            if token in model.eos_ids and not request.ignore_eos:
                reason = "stop_token"
                break
            emit.append(token)
            if len(generated) + len(emit) >= request.max_new_tokens:
                reason = "max_tokens"
                break
        if drafted:
            # a verify cached the fed token and the accepted drafts: keep only emitted ones
            cache.truncate(round_start + 1 + min(len(emit), accepted))
        text = "".join(stream.push(t) for t in emit)
        generated += emit
        history += emit
        drafter.extend(emit)
        text_parts.append(text)
        stats.emitted += len(emit)
        spec = {}
        if policy.mode != "off":
            spec = {"mode": policy.mode, "k": drafted, "accepted": accepted, **stats.to_dict()}
        prof = timer.finish(
            StepProfile(
                step=step,
                context=cache.length,
                n_tokens=rows,
                emitted=len(emit),
                weight_bytes=bytes_per_token,
                kv_bytes=cache.length * cache.bytes_per_token(),
                spec=spec,
            )
        )
        if emit:
            yield Tokens(text=text, ids=emit, profile=prof)
        step += 1
        if reason is None and cancel is not None and cancel.is_set():
            reason = "cancelled"
        if reason is None and cache.length + 1 > max_context:
            reason = "context_full"
        if reason is not None:
            break
        # next forward: one token, or the last token plus verified drafts
        last = generated[-1]
        room = min(request.max_new_tokens - len(generated) - 1, max_context - cache.length - 1)
        drafts = drafter.draft(min(policy.k_max, room)) if policy.mode != "off" else []
        k = policy.choose_k(len(drafts))
        drafts = drafts[:k]
        timer = StepTimer()
        round_start = cache.length
        feed = np.array([last, *drafts])
        logits = model.text.forward(
            feed,
            text_positions(round_start, len(feed), rope_delta),
            cache,
            timer=timer,
            logits="all" if drafts else "last",
        )
        check_logits(logits, cache, round_start, f"token {len(generated) + 1} of the answer")
        forward_s = time.perf_counter() - timer._t0
        stats.forwards += 1
        rows, drafted = len(feed), len(drafts)
        if not drafts:
            accepted = 0
            policy.record_step(forward_s)
            new_tokens = [sampler.sample(logits[-1], history)]
            continue
        if exact_greedy:
            accepted, new_tokens = accept_greedy(logits, drafts)
        else:
            accepted, new_tokens = accept_sampled(logits, drafts, sampler, history)
        policy.record_verify(drafted, accepted, forward_s)
        stats.tries += 1
        stats.drafted += drafted
        stats.hits += accepted
        stats.kv_rolls += drafted - accepted
        cache.truncate(round_start + 1 + accepted)
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
            "cached_tokens": cache.length,
            "spec": {"mode": policy.mode, **stats.to_dict()},
            "notices": [spec_notice] if spec_notice else [],
            "token_ids": generated,
            "text": "".join(text_parts),
        },
    )
