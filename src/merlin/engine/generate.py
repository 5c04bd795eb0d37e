"""Generation as small functions over the one model entry point, `model.text.forward`.

    prefill(model, cache, prompt, start)   rows start.. of a Prompt into the cache (chunked)
    decode_step(model, cache, tokens, d)   one forward of fed tokens at text positions
    speculative_step(...)                  verify drafts in one forward, keep what agrees
    generate(model, prompt, options, ...)  the three composed into a stream of events:
                                           PrefillDone, Tokens..., Finished

The events are plain dataclasses (no Qt); `event_json` gives the JSON objects `merlin-cli
--json` prints. Cancellation is checked between forwards (and between prefill chunks), so a
cancelled run keeps everything it produced and the KV cache holds exactly the tokens fed.
Options of one answer are one type, AnswerOptions; the session adds its own settings
(engine.session.SessionSettings) and the app maps its settings onto both
(app/model/prompting.py). A thinking model's answer is split and its budget kept by one hook
in the loop (engine.thinking.Steer). Over 500 lines because the options, the events and the
loop that makes them are read together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from . import thinking
from .errors import InputError
from .finite import check_logits
from .kv_cache import KVCache
from .profile import StepProfile, StepTimer
from .prompt import Prompt
from .rope import text_positions
from .sampling import Sampler, SamplingParams
from .speculative import Drafter, SpecPolicy, SpecStats, accept
from .tokenizer import StreamDecoder

FINISH_REASONS = ("stop_token", "max_tokens", "cancelled", "context_full", "error")
# q8 weights that prefill through BLAS (engine.linear.prefill_dequantizes): a suffix of up to
# this many rows is prefilled as forwards of engine.linear.SMALL_N rows, beyond it as one forward
SMALL_PREFILL_ROWS = 128


# ---- options and events ------------------------------------------------------------------------


@dataclass
class AnswerOptions:
    """How to produce one answer (the CLI's flags, the app's settings, a test's choice)."""

    sampling: SamplingParams | None = None  # None: the checkpoint's generation_config.json
    max_new_tokens: int = 512
    ignore_eos: bool = False  # eos tokens are generated like any other token
    spec: str = "auto"  # speculative decoding: off | on | auto
    spec_k: int = 4  # drafts per verify (the maximum, in auto mode)
    thinking: str = "auto"  # auto | on | off (engine.thinking; the prompt is built for it)
    thinking_budget: int | None = None  # reasoning tokens before the engine closes the block

    def resolved(self, model) -> AnswerOptions:
        """These options checked (InputError), with the model's default sampling filled in."""
        if int(self.max_new_tokens) < 1:
            raise InputError("max new tokens must be at least 1.")
        thinking.check_mode(self.thinking)
        thinking.check_budget(self.thinking_budget)
        sampling = (self.sampling or model.defaults.sampling).validate()
        return replace(self, sampling=sampling, max_new_tokens=int(self.max_new_tokens))

    @classmethod
    def of(cls, options: AnswerOptions | None = None, **overrides) -> AnswerOptions:
        """options (default: the defaults) with keyword overrides (field names)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown answer option(s): {', '.join(unknown)}")
        return replace(options or cls(), **overrides)


@dataclass
class PrefillDone:
    n_tokens: int  # rows computed
    vision_ms: float
    prefill_ms: float
    reused: int = 0  # rows the cache already held


@dataclass
class Tokens:
    """Newly decoded text. With a thinking template (engine.thinking) `text` is answer text
    only and `reasoning` the reasoning text; reasoning_ids: how many of `ids` are reasoning
    tokens (the `<think>` tags included)."""

    text: str
    ids: list[int]
    profile: StepProfile
    reasoning: str = ""
    reasoning_ids: int = 0


@dataclass
class Finished:
    """The end of an answer, with its totals. Fields a session adds (reused_tokens,
    context_tokens, dropped_messages) are None from plain generate()."""

    reason: str  # one of FINISH_REASONS
    prompt_tokens: int = 0  # prompt rows computed by this answer
    generated_tokens: int = 0
    prefill_ms: float = 0.0
    vision_ms: float = 0.0
    decode_ms: float = 0.0
    tokens_per_s: float = 0.0
    cached_tokens: int = 0  # rows in the KV cache at the end
    spec: dict = field(default_factory=dict)  # speculative decoding statistics
    notices: list[str] = field(default_factory=list)  # sentences to show with the answer
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    reused_tokens: int | None = None  # prompt rows taken from the cache
    context_tokens: int | None = None  # tokens of the conversation the model saw
    dropped_messages: list[int] | None = None  # messages left out of the context
    extra: dict | None = None  # what a caller measured around the engine (Finished.of)
    reasoning: str | None = None  # a thinking template's reasoning (text: the answer only)
    reasoning_tokens: int | None = None
    thinking_budget_closed: bool | None = None  # the engine closed the block (budget spent)
    answer_ids: list[int] | None = None  # a thinking answer: the ids of `text` (when exact)

    def to_dict(self) -> dict:
        """The JSON form (`merlin-cli --json`, the app's stored stats): fields that are None
        are left out."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = round(v, 3) if isinstance(v, float) else v
        return out

    @property
    def totals(self) -> dict:
        """Everything but the reason, as a dict (the JSON form; read fields instead)."""
        d = self.to_dict()
        d.pop("reason")
        d.update(d.pop("extra", None) or {})
        return d

    @classmethod
    def of(cls, reason: str, totals: dict) -> Finished:
        """From a totals dict (a remote server's answer, a served one): known keys become
        fields, the rest is kept in `extra` (shown by .totals, never read by the engine)."""
        known = {f.name for f in fields(cls)} - {"reason", "extra"}
        return cls(
            reason,
            **{k: v for k, v in totals.items() if k in known},
            extra={k: v for k, v in totals.items() if k not in known},
        )


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
        out = {"event": "tokens", "text": event.text, "ids": event.ids}
        if event.reasoning or event.reasoning_ids:
            out.update(reasoning=event.reasoning, reasoning_ids=event.reasoning_ids)
        out["profile"] = event.profile.to_dict()
        return out
    return {"event": "finished", **event.to_dict()}


# ---- the steps ---------------------------------------------------------------------------------


def check_prompt(model, prompt_ids: Sequence[int], max_context: int) -> None:
    if len(prompt_ids) == 0:
        raise InputError("the prompt is empty; type a question first.")
    if len(prompt_ids) >= max_context:
        limit = model.config.text.max_position_embeddings
        fix = (
            "shorten it"
            if max_context >= limit
            else "shorten it or raise the context budget (merlin-cli: --max-context)"
        )
        raise InputError(
            f"the prompt is {len(prompt_ids)} tokens but the context holds {max_context}"
            f"{' (all the model reads)' if max_context >= limit else ''}; {fix}."
        )
    bad = [t for t in prompt_ids if not 0 <= t < model.config.text.vocab_size]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the model's vocabulary.")


def prefill_chunk(model, n_new: int, small_rows: int = SMALL_PREFILL_ROWS) -> int:
    """Rows per forward to prefill n_new rows. q8 weights that prefill through BLAS
    (linear.prefill_dequantizes: row-major, or in 8-row groups) make a large forward pay a
    fixed cost (every weight matrix dequantized to f32 for BLAS) that dwarfs a short
    follow-up; the decode kernels read the quantized weights directly, so up to small_rows
    rows go as forwards of SMALL_N rows. Other grouped weights run those kernels at any N:
    one forward. A fixed rule (no timing), so the same rows are always computed the
    same way, bit for bit."""
    from . import linear

    if (
        any(map(linear.prefill_dequantizes, model.text.w.matrices()))
        and linear.SMALL_N < n_new <= small_rows
    ):
        return linear.SMALL_N
    return max(1, n_new)


def image_inputs(model, prompt: Prompt, start: int = 0, embedding: Callable | None = None):
    """The image rows of prompt rows start.. (engine.vision.ImageInputs, rows relative to
    start), or None when there are none. embedding(image) -> (embeds [n, D], deepstack
    [levels, n, D]) gives one image's rows (a session's cache); by default the encoder runs
    on the images needed, in one call."""
    from .vision.model import ImageInputs

    need = [(sp, im) for sp, im in zip(prompt.spans, prompt.images) if sp.end > start]
    if not need:
        return None
    t0 = time.perf_counter()
    if embedding is None:
        out = model.vision.encode([im for _, im in need])
        embeds = out.embeds
        deep = np.stack(out.deepstack) if out.deepstack else np.zeros((0, *embeds.shape))
        per, o = [], 0
        for sp, _ in need:
            n = sp.end - sp.start
            per.append((embeds[o : o + n], deep[:, o : o + n]))
            o += n
        if o != embeds.shape[0]:
            raise InputError(
                f"the vision encoder gave {embeds.shape[0]} rows for images of {o} tokens."
            )
    else:
        per = [embedding(im) for _, im in need]
    rows, parts, deeps = [], [], []
    for (sp, _), (emb, dp) in zip(need, per):
        a = max(sp.start, start)
        rows.append(np.arange(a - start, sp.end - start, dtype=np.int64))
        parts.append(emb[a - sp.start :])
        deeps.append(dp[:, a - sp.start :])
    deepstack = np.concatenate(deeps, axis=1)
    return ImageInputs(
        embeds=np.ascontiguousarray(np.concatenate(parts), np.float32),
        rows=np.concatenate(rows),
        deepstack=[np.ascontiguousarray(d, np.float32) for d in deepstack],
        vision_ms=(time.perf_counter() - t0) * 1e3,
        output=None,
    )


def _image_kw(inputs, lo: int, hi: int) -> dict:
    """forward() keywords for the image rows of `inputs` in [lo, hi), rebased to lo."""
    if inputs is None:
        return {}
    sel = (inputs.rows >= lo) & (inputs.rows < hi)
    if not sel.any():
        return {}
    return dict(
        embeds=np.ascontiguousarray(inputs.embeds[sel]),
        embed_rows=inputs.rows[sel] - lo,
        deepstack=[np.ascontiguousarray(d[sel]) for d in inputs.deepstack],
    )


def prefill(
    model,
    cache: KVCache,
    prompt: Prompt,
    start: int | None = None,
    *,
    images=None,
    logits: bool = True,
    chunk: int | None = None,
    small_rows: int = SMALL_PREFILL_ROWS,
    cancel: threading.Event | None = None,
    timer: StepTimer | None = None,
    max_chunk: int | None = None,
) -> np.ndarray | None:
    """Feed rows start.. of `prompt` (default: the rows the cache does not hold) into
    `cache`, in forwards of `chunk` rows (default: prefill_chunk's rule). images: the image
    rows of rows start.. (image_inputs). Returns the last row's logits [V] with logits=True;
    None without, or when `cancel` was set before a chunk (cache.length says how far it got).
    With logits the last chunk always runs: it decides the answer's first token, and the
    decode loop sees the cancel right after it.
    """
    start = cache.length - prompt.offset if start is None else int(start)
    n = len(prompt.ids)
    step = int(chunk) if chunk else prefill_chunk(model, n - start, small_rows)
    if max_chunk:  # at most this many rows a forward: Stop is seen between them
        step = min(step, max(1, int(max_chunk)))
    done, out = start, None
    while done < n:
        end = min(n, done + step)
        if cancel is not None and cancel.is_set() and (end < n or not logits):
            return None
        want = "last" if logits and end == n else "none"
        out = model.text.forward(
            np.asarray(prompt.ids[done:end]),
            prompt.positions[:, done:end],
            cache,
            timer=timer,
            logits=want,
            **_image_kw(images, done - start, end - start),
        )
        done = end
    return out[-1] if logits and out is not None else None


def decode_step(
    model,
    cache: KVCache,
    tokens: Sequence[int],
    rope_delta: int,
    *,
    all_logits: bool = False,
    timer: StepTimer | None = None,
) -> np.ndarray:
    """One forward of `tokens` after the cached rows (text positions: index + rope_delta);
    logits of the last row [1, V], or of every row with all_logits."""
    feed = np.asarray(tokens)
    return model.text.forward(
        feed,
        text_positions(cache.length, len(feed), rope_delta),
        cache,
        timer=timer,
        logits="all" if all_logits else "last",
    )


def speculative_step(
    model,
    cache: KVCache,
    last: int,
    drafts: Sequence[int],
    rope_delta: int,
    sampler: Sampler,
    history: Sequence[int],
    *,
    timer: StepTimer | None = None,
) -> tuple[int, list[int]]:
    """Feed [last, *drafts] in one forward (its rows equal one-token forwards), accept the
    longest prefix of drafts the model agrees with (engine.speculative), roll the cache back
    to last + the accepted drafts. Returns (accepted, the tokens this forward decided)."""
    round_start = cache.length
    logits = decode_step(model, cache, [last, *drafts], rope_delta, all_logits=True, timer=timer)
    check_logits(logits, cache, round_start, "a verify step of the answer")  # NaN/inf: stop
    accepted, new = accept(logits, drafts, sampler, history)
    cache.truncate(round_start + 1 + accepted)
    return accepted, new


# ---- the loop ----------------------------------------------------------------------------------


def generate(
    model,
    prompt: Prompt,
    options: AnswerOptions | None = None,
    *,
    cache: KVCache | None = None,
    start: int | None = None,
    images=None,
    max_context: int | None = None,
    cancel: threading.Event | None = None,
    drafter: Drafter | None = None,
    small_rows: int = SMALL_PREFILL_ROWS,
    max_chunk: int | None = None,
    turn: thinking.ThinkingTurn | None = None,
) -> Iterator[PrefillDone | Tokens | Finished]:
    """Answer `prompt`. `cache` may hold its first rows already (start: how many; default
    cache.length - prompt.offset, and it must be that); images: the image rows of rows
    start.. (image_inputs; default: the encoder runs on the prompt's images); `drafter` may
    carry the history for speculative drafts (default: a new one over the prompt); turn: the
    answer's thinking (engine.thinking.plan_turn; default: planned from the options)."""
    options = (options or AnswerOptions()).resolved(model)
    if turn is None:
        turn = thinking.plan_turn(
            model.tokenizer, prompt.ids, options.thinking, options.thinking_budget
        )
    steer = turn.steer()
    max_context = min(max_context or model.default_context, model.max_context)
    if cache is None:
        cache = model.new_cache(max_context)
    start = cache.length - prompt.offset if start is None else int(start)
    if start + prompt.offset != cache.length or start < 0:
        raise ValueError(f"the cache holds {cache.length} rows, not the prompt's first {start}")
    n = len(prompt.ids)
    check_prompt(model, prompt.ids[start:], max_context - cache.length)
    policy, spec_notice = SpecPolicy.or_off(options.spec, options.spec_k)
    sampling = options.sampling
    sampler = Sampler(sampling)
    stream = StreamDecoder(model.tokenizer)
    if drafter is None:
        drafter = Drafter(exclude={model.config.image_token_id, model.config.video_token_id})
        drafter.extend(prompt.ids)
    history = list(prompt.ids)
    generated: list[int] = []
    text_parts: list[str] = []
    notices = [spec_notice] if spec_notice else []
    stats = SpecStats()
    bytes_per_token = model.bytes_per_token
    rope_delta = prompt.rope_delta
    routed = model.config.is_moe  # bytes read depend on the experts each forward chose

    timer = StepTimer()  # the vision encoder's time shows in this step's "other"
    t0 = time.perf_counter()
    encoder_ms = 0.0  # the part of vision_ms spent in this call
    if images is None and any(sp.end > start for sp in prompt.spans):
        images = image_inputs(model, prompt, start)
        encoder_ms = images.vision_ms
    vision_ms = images.vision_ms if images is not None else 0.0
    prompt_start = cache.length
    logits = prefill(
        model, cache, prompt, start, images=images, cancel=cancel, timer=timer,
        small_rows=small_rows, max_chunk=max_chunk,
    )  # fmt: skip
    prefill_ms = (time.perf_counter() - t0) * 1e3 - encoder_ms
    if logits is None:  # cancelled between prefill chunks
        yield Finished(
            "cancelled",
            prompt_tokens=cache.length - start,
            prefill_ms=prefill_ms,
            vision_ms=vision_ms,
            cached_tokens=cache.length,
            notices=notices,
        )
        return
    check_logits(logits, cache, prompt_start, "the prompt")  # NaN/inf: stop with a message
    yield PrefillDone(n_tokens=n - start, vision_ms=vision_ms, prefill_ms=prefill_ms)
    t_decode0 = time.perf_counter()
    stats.forwards = 1
    reason = None
    step = 0
    new_tokens = [sampler.sample(logits, history)]  # decided by the last forward
    rows, drafted, accepted, round_start = n - start, 0, 0, 0
    rng_before = None  # the sampler's RNG before a verify (its void positions give it back)
    while True:
        # emit what the last forward decided, up to a stop token or the token budget
        emit, answer, reasoning, n_reasoning, replaced = [], [], [], 0, False
        for token in new_tokens:
            chosen = steer.choose(token)  # the thinking budget may close the block instead
            if chosen in model.eos_ids and not options.ignore_eos:
                reason = "stop_token"
                break
            emit.append(chosen)
            replaced = chosen != token  # a closing id replaced the decided one
            # an end-of-turn token kept by ignore_eos counts as generated but is never text
            # (StreamDecoder is never given one; vLLM skips special tokens in its text too)
            a, r = steer.feed("" if chosen in model.eos_ids else stream.push(chosen))
            answer.append(a)
            reasoning.append(r)
            n_reasoning += steer.last_was_reasoning()
            if len(generated) + len(emit) >= options.max_new_tokens:
                reason = "max_tokens"
                break
            if replaced:  # the rest of what the forward decided is void
                break
        if drafted:
            # a verify cached the fed token and the accepted drafts: keep only emitted ones
            # (a closing id the budget put in place of a draft is not in the cache)
            cache.truncate(round_start + 1 + min(len(emit) - replaced, accepted))
            if replaced and len(emit) < len(new_tokens):  # as many draws as plain decoding
                sampler.rewind(rng_before, len(emit))
        text = "".join(answer)
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
                weight_bytes=model.text.last_weight_bytes if routed else bytes_per_token,
                kv_bytes=cache.length * cache.bytes_per_token(),
                experts_read=model.text.experts_read,
                spec=spec,
            )
        )
        if emit:
            yield Tokens(text, emit, prof, "".join(reasoning), n_reasoning)
        step += 1
        if reason is None and cancel is not None and cancel.is_set():
            reason = "cancelled"
        if reason is None and cache.length + 1 > max_context:
            reason = "context_full"
        if reason is not None:
            break
        # next forward: one token, or the last token plus verified drafts
        last = generated[-1]
        room = min(options.max_new_tokens - len(generated) - 1, max_context - cache.length - 1)
        drafting = policy.mode != "off" and not steer.forcing
        drafts = drafter.draft(min(policy.k_max, room)) if drafting else []
        drafts = drafts[: policy.choose_k(len(drafts))]
        timer = StepTimer()
        round_start = cache.length
        rows, drafted = 1 + len(drafts), len(drafts)
        stats.forwards += 1
        if not drafts:
            accepted = 0
            logits = decode_step(model, cache, [last], rope_delta, timer=timer)
            check_logits(logits, cache, round_start, f"token {len(generated) + 1} of the answer")
            policy.record_step(time.perf_counter() - timer._t0)
            new_tokens = [sampler.sample(logits[-1], history)]
            continue
        rng_before = sampler.rng.bit_generator.state
        accepted, new_tokens = speculative_step(
            model, cache, last, drafts, rope_delta, sampler, history, timer=timer
        )
        policy.record_verify(drafted, accepted, time.perf_counter() - timer._t0)
        stats.tries += 1
        stats.drafted += drafted
        stats.hits += accepted
        stats.kv_rolls += drafted - accepted
    tail, tail_reasoning = steer.flush(stream.flush())
    if tail or tail_reasoning:
        text_parts.append(tail)
        yield Tokens(tail, [], StepProfile(step=step, context=cache.length), tail_reasoning)
    decode_s = time.perf_counter() - t_decode0
    yield Finished(
        reason,
        prompt_tokens=n - start,
        generated_tokens=len(generated),
        prefill_ms=prefill_ms,
        vision_ms=vision_ms,
        decode_ms=decode_s * 1e3,
        tokens_per_s=len(generated) / decode_s if decode_s > 0 else 0.0,
        cached_tokens=cache.length,
        spec={"mode": policy.mode, **stats.to_dict()},
        notices=notices,
        token_ids=generated,
        text="".join(text_parts),
        **steer.totals(model.tokenizer, generated),  # a thinking model's reasoning apart
    )
