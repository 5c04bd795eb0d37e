"""Session: one conversation with a loaded model, its KV cache reused across turns, edits,
regenerations and process restarts.

Every turn builds the whole conversation's Prompt (engine.prompt.build_prompt: the chat
template, with each answer taken as the ids it was generated as), finds the longest prefix
the KV cache already holds (same token ids, same 3D positions, same images by content hash),
truncates the cache there and lets engine.generate prefill only the rest and answer. Positions
of the whole conversation are computed from its start every turn, so the rope delta after an
image is always the one a fresh computation would use. The other jobs live beside this file:
conversation.py (messages), images.py (image intake, embeddings by hash), fitting.py (which
turns to leave out), persistence.py (the file format), store.py (the folder of saved files).

    session = Session(model, system="You are terse.", settings=SessionSettings(8192))
    for event in session.ask("What is in the picture?", images=["cat.jpg"]):
        ...  # ContextTrimmed?, PrefillDone(n_tokens computed, reused), Tokens..., Finished
    for event in session.ask("And its colour?"):  # prefills only the new turn
        ...
    session.save(path)                       # or SessionStore(...).save(session, chat_id)
    session2, result = Session.open(model, path)   # result.restored, result.reason

The app stays declarative: `session.respond(messages)` with the whole conversation as it
stores it (ending with the question); edits and regenerations need no special calls, the
common prefix is found either way, and answers the session remembers keep their ids.

One class of ~500 lines on purpose: asking, editing, regenerating, warming, saving and
restoring all read and change the same four things (the KV cache, the ids and positions it
holds, their image spans, the remembered answers); every separable job is already its own
file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import arrayfile, thinking
from ..errors import InputError, TokenizerError
from ..generate import (
    AnswerOptions,
    Finished,
    PrefillDone,
    Tokens,
    generate,
    image_inputs,
    prefill,
    prefill_chunk,
)
from ..kv_cache import KVCache
from ..memory import DEFAULT_CONTEXT
from ..prompt import (
    MAX_IMAGES_PER_MESSAGE,
    ImageSpan,
    Prompt,
    build_prompt,
    check_user_text,
    offsets_after_check,
)
from ..rope import text_positions
from ..session_check import MAX_SAVED_TEXT_CHARS
from ..speculative import Drafter
from ..vision.encoder import EncodeCancelled
from . import persistence
from .conversation import Message, SessionImage, adopt_ids, check_offsets, common_prefix
from .fitting import fit_context
from .images import ImageBank
from .persistence import SESSION_KIND, CachedRows, RestoreResult
from .prefix import reuse_point

log = logging.getLogger("merlin.engine.session")


@dataclass
class SessionSettings:
    # tokens the conversation may use (0: the model's maximum; the default, memory.
    # DEFAULT_CONTEXT, is what the load-time memory guard counts)
    context_budget: int = DEFAULT_CONTEXT
    answer_reserve: int = 512  # tokens kept free for the answer when deciding what fits
    trim_fraction: float = 0.75  # when older turns must go, drop until this full (fewer redos)
    max_pixels: int | None = None  # legacy pixel budget, used when image_tokens is None
    # image-token budget per image (None: max_pixels, else the machine class's default;
    # engine/vision/budget.py); an image may carry its own (vision.budget.BudgetedImage)
    image_tokens: int | None = None
    warm_chunk: int = 512  # rows per forward in warm() (cancellable between chunks)
    # row-major q8 weights: a suffix of up to this many rows is prefilled as forwards of
    # engine.linear.SMALL_N rows (engine.generate.prefill_chunk)
    small_prefill_rows: int = 128


class Session:
    """One conversation with a loaded model. Not thread-safe: use it from one thread."""

    def __init__(self, model, system: str = "", settings: SessionSettings | None = None):
        self.model = model
        self.system = system or ""
        self.settings = settings or SessionSettings()
        self._messages: list[Message] = []
        self._dropped: set[int] = set()
        self.images = ImageBank(model, self.settings.max_pixels, self.settings.image_tokens)
        self.vision_progress = None  # called (blocks done, depth) while an image is encoded
        self._template_kwargs: dict = {}  # the last turn's thinking mode (engine.thinking)
        self._reset_cache()

    # ---- state ---------------------------------------------------------------------------------

    def _reset_cache(self) -> None:
        cfg = self.model.config
        self.cache: KVCache = self.model.new_cache(self.budget)
        self._tokens: list[int] = []  # ids of the cached rows (len == cache.length)
        self._positions = np.zeros((3, 0), np.int64)  # their 3D positions
        self._rope_delta = 0  # decode position = cache index + this (after the prompt)
        self._spans: list[ImageSpan] = []  # cached image rows
        self.drafter = Drafter(exclude={cfg.image_token_id, cfg.video_token_id})

    @property
    def budget(self) -> int:
        """The context budget in tokens (the setting, capped at the model's maximum)."""
        b = self.settings.context_budget or self.model.max_context
        return max(1, min(int(b), self.model.max_context))

    def set_context_budget(self, tokens: int) -> None:
        """Change the budget (0: the model's maximum). Messages left out earlier are offered
        to the model again; the cache is kept when it still fits."""
        self.settings.context_budget = int(tokens)
        self._dropped = set()
        self._sync_budget()

    @property
    def messages(self) -> list[Message]:
        """The conversation (a copy), including messages left out of the model's context."""
        return list(self._messages)

    @property
    def dropped(self) -> list[int]:
        """Indexes of messages the model no longer sees (context budget)."""
        return sorted(self._dropped)

    @property
    def cached_tokens(self) -> int:
        """Tokens whose K/V rows the cache holds."""
        return len(self._tokens)

    @property
    def token_ids(self) -> list[int]:
        return list(self._tokens)

    @property
    def rope_delta(self) -> int:
        return self._rope_delta

    @property
    def cache_bytes(self) -> int:
        return self.cache.length * self.cache.bytes_per_token()

    @property
    def _embeddings(self) -> dict:
        return self.images.embeddings

    def set_system(self, system: str) -> None:
        self.system = system or ""

    def set_messages(self, messages: Sequence[Message]) -> None:
        """Replace the conversation (e.g. with the app's stored chat). Nothing is computed now;
        the next turn reuses whatever prefix the cache holds."""
        messages = self._normalize(messages)
        self._dropped = self._still_left_out(messages)
        self._messages = messages
        self._prune_embeddings()

    def _still_left_out(self, messages: Sequence[Message]) -> set[int]:
        """The messages left out of the context that stay left out for `messages`: those of
        the conversation so far when `messages` goes on from its last question (a follow-up,
        a regenerated last answer, an edited last question: the cache keeps its prefix).
        Going back further (a version of an earlier answer), they were left out to make room
        for turns that are not there: none, and the budget decides afresh."""
        keep = common_prefix(self._messages, messages)
        users = [i for i, m in enumerate(self._messages) if m.role == "user"]
        if users and keep < users[-1]:
            return set()
        return {i for i in self._dropped if i < keep}

    def drop_cache(self, keep_tokens: int = 0) -> None:
        """Release the cached rows from keep_tokens on (e.g. to free memory for another
        chat); the conversation is kept and the next turn recomputes what is missing."""
        self._truncate(max(0, min(int(keep_tokens), self.cache.length)))
        if self.cache.length == 0:
            self._reset_cache()

    def reset(self) -> None:
        """Forget the conversation and the cache (the embeddings too)."""
        self._messages, self._dropped = [], set()
        self.images.keep_only(())
        self._reset_cache()

    # ---- messages and images -------------------------------------------------------------------

    def image(self, image) -> SessionImage:
        """A path, PIL image, PreparedImage or SessionImage -> SessionImage (see ImageBank)."""
        self._sync_budgets()
        return self.images.image(image)

    def _spells(self, ids: list[int], text: str) -> bool:
        """Whether ids are this model's tokenizer's spelling of text (not another's)."""
        try:
            return self.model.tokenizer.decode(ids) == text
        except TokenizerError:
            return False

    def _normalize(self, messages: Sequence[Message]) -> list[Message]:
        out = []
        spells = self._spells
        known = self._messages
        for i, m in enumerate(messages):
            if i < len(known) and m is known[i]:  # normalized when it was added: as it is
                out.append(m)
                continue
            if isinstance(m, dict):
                m = Message(
                    m.get("role"), m.get("text", ""), list(m.get("images", [])),
                    reasoning=m.get("reasoning"), image_offsets=m.get("image_offsets"),
                )  # fmt: skip
            if m.role not in ("user", "assistant"):
                raise InputError(f"message {i}: role must be 'user' or 'assistant'.")
            if not isinstance(m.text, str):
                raise InputError(f"message {i}: text must be a string.")
            if m.images and m.role != "user":
                raise InputError(f"message {i}: only user messages can have images.")
            if len(m.images) > MAX_IMAGES_PER_MESSAGE:
                raise InputError(
                    f"message {i} has {len(m.images)} pictures; a message takes at most "
                    f"{MAX_IMAGES_PER_MESSAGE}. Ask about the rest in another message."
                )
            # what a person typed: lone surrogates cleaned, a huge paste refused before the
            # tokenizer sees it (engine.prompt.check_user_text)
            text = check_user_text(m.text) if m.role == "user" else m.text
            ids = getattr(m, "ids", None)
            if ids is not None and (m.role != "assistant" or not spells(ids, text)):
                ids = None  # not the ids of this text (edited, or another tokenizer's)
            reasoning = getattr(m, "reasoning", None) if m.role == "assistant" else None
            if reasoning is not None and not isinstance(reasoning, str):
                raise InputError(f"message {i}: reasoning must be a string.")
            offsets = getattr(m, "image_offsets", None)
            if offsets is not None:
                offsets = _offsets_in(m.text, text, offsets, len(m.images), i)
            images = [self.image(im) for im in m.images]
            out.append(Message(m.role, text, images, ids, reasoning, offsets))
        return adopt_ids(self._messages, out)

    def _sync_budgets(self) -> None:
        """The image bank follows the settings (image budgets, the context)."""
        bank = self.images
        bank.max_pixels, bank.image_tokens = self.settings.max_pixels, self.settings.image_tokens
        bank.context = self.budget

    def _sync_images(self, cancel: threading.Event | None) -> None:
        """... and this turn's cancel Event and progress callback for its encodes."""
        self._sync_budgets()
        self.images.cancel, self.images.progress = cancel, self.vision_progress

    def encode_image(self, image, cancel: threading.Event | None = None) -> SessionImage:
        """Prepare and encode an image now (e.g. when it is attached, while the user types),
        so that the turn that sends it finds its embedding (in this session or, through
        model.vision.embeddings, in another one). EncodeCancelled if `cancel` is set."""
        im = self.image(image)
        self._sync_images(cancel)
        try:
            self.images.embedding(im)
        finally:
            self.images.cancel = None
        return im

    def _prune_embeddings(self) -> None:
        self.images.keep_only(im.hash for m in self._messages for im in m.images)

    # ---- prompt and reuse ----------------------------------------------------------------------

    def _render(self, messages, dropped: set[int], generation_prompt: bool = True) -> Prompt:
        kept = [m for i, m in enumerate(messages) if i not in dropped]
        tok, cfg = self.model.tokenizer, self.model.config
        return build_prompt(
            tok, cfg, kept, system=self.system, generation_prompt=generation_prompt,
            template_kwargs=self._template_kwargs,
        )  # fmt: skip

    def _fit(self, messages, dropped: set[int], reserve: int, gen_prompt: bool = True):
        return fit_context(
            messages,
            dropped,
            lambda d: self._render(messages, d, gen_prompt),
            budget=self.budget,
            reserve=reserve,
            trim_fraction=self.settings.trim_fraction,
            system=self.system,
            min_tokens=self._min_tokens,
        )

    def _min_tokens(self, message) -> int:
        """A lower bound of a message's tokens: a user's text (stripped, as many templates
        render it) over the longest token's characters (a template may shorten a reply, e.g.
        drop its reasoning: 0)."""
        if message.role != "user":
            return 0
        return len(message.text.strip()) // self.model.tokenizer.longest_token_chars

    def _reuse_point(self, p: Prompt, need_logits: bool = True) -> int:
        return reuse_point(self._tokens, self._positions, self._spans, p, need_logits)

    def _truncate(self, n: int) -> None:
        for sp in self._spans:
            if sp.start < n < sp.end:  # never keep part of an image
                n = sp.start
                break
        n = min(n, self.cache.length)
        self.cache.truncate(n)
        self._tokens = self._tokens[:n]
        self._positions = self._positions[:, :n]
        self._spans = [sp for sp in self._spans if sp.end <= n]

    def _sync_drafter(self, ids: list[int]) -> None:
        h = self.drafter.history
        if len(h) <= len(ids) and h == ids[: len(h)]:
            self.drafter.extend(ids[len(h) :])
        else:
            self.drafter.reset(ids)

    def _commit(self, p: Prompt, emitted: list[int]) -> None:
        """The cache holds rows 0..cache.length-1 of ids + emitted: record what they are."""
        n_prompt = len(p.ids)
        seq = p.ids + list(emitted)
        n = min(self.cache.length, len(seq))
        self.cache.truncate(n)
        self._tokens = seq[:n]
        head = p.positions[:, : min(n, n_prompt)]
        if n > n_prompt:
            head = np.concatenate([head, text_positions(n_prompt, n - n_prompt, p.rope_delta)], 1)
        self._positions = np.ascontiguousarray(head)
        self._rope_delta = p.rope_delta
        self._spans = [sp for sp in p.spans if sp.end <= n]
        for sp in p.spans:
            if sp.start < n < sp.end:
                self._truncate(sp.start)

    def _sync_budget(self) -> None:
        """Follow a changed settings.context_budget (the cached prefix stays valid)."""
        budget = self.budget
        if self.cache.max_tokens != budget:
            if self.cache.length > budget:
                self._truncate(budget)
            self.cache.set_budget(budget)

    def _start(self, p: Prompt, need_logits: bool = True):
        """Cut the cache back to the prompt's reusable prefix; (reuse, image rows after it)."""
        self._sync_budget()
        self._truncate(self._reuse_point(p, need_logits))
        reuse = self.cache.length
        self._sync_budgets()
        inputs = image_inputs(self.model, p, reuse, self.images.embedding)
        self._sync_drafter(p.ids)
        return reuse, inputs

    def count(self, messages: Sequence[Message], options=None):
        """The prompt tokens answering `messages` would use, without computing anything
        (session/counting.py: PromptCount, equal to that turn's PrefillDone n_tokens + reused)."""
        from .counting import count_prompt

        return count_prompt(self, messages, options)

    # ---- turns ---------------------------------------------------------------------------------

    def ask(self, text: str, images: Iterable = (), options=None, **gen) -> Iterator:
        """Add a user turn and answer it: see respond() for the options and events."""
        msgs = [*self._messages, Message("user", text, list(images))]
        return self.respond(msgs, options, **gen)

    def regenerate(self, options=None, **gen) -> Iterator:
        """Answer the last question again (its previous answer is replaced)."""
        msgs = list(self._messages)
        while msgs and msgs[-1].role == "assistant":
            msgs.pop()
        if not msgs:
            raise InputError("there is no question to answer again; type one first.")
        return self.respond(msgs, options, **gen)

    def edit(self, index: int, text: str, images=None, options=None, **gen) -> Iterator:
        """Replace user message `index` (and drop everything after it), then answer it."""
        if not 0 <= index < len(self._messages) or self._messages[index].role != "user":
            raise InputError(f"message {index} is not a user message of this conversation.")
        old = self._messages[index]
        new = Message("user", text, list(old.images if images is None else images))
        return self.respond([*self._messages[:index], new], options, **gen)

    def respond(
        self,
        messages: Sequence[Message] | None = None,
        options: AnswerOptions | None = None,
        *,
        cancel: threading.Event | None = None,
        **overrides,
    ) -> Iterator:
        """Answer the last message of `messages` (default: the session's), which must be a
        user message. options: engine.generate.AnswerOptions; keyword overrides name its
        fields (sampling=, max_new_tokens=, ignore_eos=, spec=, spec_k=). Checks happen now
        (InputError: empty question, unusable image, a question that cannot fit); the work
        happens while iterating the returned events:

        ContextTrimmed (only when older messages had to be left out), PrefillDone
        (n_tokens = rows computed, reused = rows taken from the cache, vision_ms = encoder
        time, 0 when every image was cached), Tokens..., Finished (with reused_tokens,
        context_tokens, dropped_messages; notices include the trim notice).

        When the events end (any finish reason, or the caller stops iterating), the answer
        so far is the conversation's last assistant message (with the ids it was generated
        as) and the cache is consistent with it; if computing fails before any token, the
        conversation is left as it was.
        """
        options = AnswerOptions.of(options, **overrides)
        msgs = self._normalize(self._messages if messages is None else messages)
        if not msgs or msgs[-1].role != "user":
            raise InputError("the conversation must end with a question to answer.")
        if not msgs[-1].text.strip() and not msgs[-1].images:
            raise InputError("the message is empty; type a question first.")
        options = options.resolved(self.model)
        sup = thinking.support(self.model.tokenizer)
        self._template_kwargs = thinking.template_kwargs(sup, options.thinking)
        dropped = self._still_left_out(msgs)
        reserve = max(1, min(options.max_new_tokens, self.settings.answer_reserve))
        dropped, prompt, trimmed = self._fit(msgs, dropped, reserve)
        return self._run(msgs, dropped, prompt, trimmed, options, cancel)

    def _run(self, msgs, dropped, p: Prompt, trimmed, options, cancel) -> Iterator:
        before = (self._messages, self._dropped)
        self._messages, self._dropped = msgs, dropped
        n = len(p.ids)
        emitted: list[int] = []
        finished = False
        inner = None
        tok = self.model.tokenizer
        turn = thinking.plan_turn(tok, p.ids, options.thinking, options.thinking_budget)
        try:
            if trimmed is not None:
                yield trimmed
            self._sync_images(cancel)
            try:
                reuse, inputs = self._start(p)
            except EncodeCancelled:  # Stop while an image was encoded: nothing computed
                reuse = self.cache.length
                inner = _just(Finished("cancelled", cached_tokens=reuse))
            else:
                inner = generate(
                    self.model, p, options, cache=self.cache, start=reuse, images=inputs,
                    max_context=self.budget, cancel=cancel, drafter=self.drafter,
                    small_rows=self.settings.small_prefill_rows,
                    max_chunk=self.settings.warm_chunk if cancel is not None else None,
                    turn=turn,
                )  # fmt: skip
            for event in inner:
                if isinstance(event, PrefillDone):
                    event.reused = reuse
                elif isinstance(event, Tokens):
                    emitted += event.ids
                elif isinstance(event, Finished):
                    event.reused_tokens = reuse
                    event.context_tokens = self.cache.length
                    event.dropped_messages = sorted(self._dropped)
                    if trimmed is not None:
                        event.notices.append(trimmed.notice)
                    self._finish(p, emitted, turn)
                    finished = True
                yield event
        except BaseException:
            if not finished:
                if self.cache.length < n and not emitted:
                    # nothing answered: the conversation is as before, the cache a prefix
                    self._commit(p, [])
                    self._messages, self._dropped = before
                else:
                    self._finish(p, emitted, turn)
            raise
        finally:
            if inner is not None:
                inner.close()
        if not finished:  # the loop ended without Finished (should not happen)
            self._finish(p, emitted, turn)

    def _finish(self, p: Prompt, emitted: list[int], turn=None) -> None:
        self._commit(p, emitted)
        # a thinking answer: the reasoning apart, the answer's own ids (engine.thinking)
        reasoning, text, ids = thinking.answer_parts(self.model.tokenizer, turn, emitted)
        self._messages = [*self._messages, Message("assistant", text, [], ids, reasoning)]
        self._prune_embeddings()

    def _ahead_chunk(self, n_new: int) -> int:
        """Rows per forward for work done while the user types (warm, prefill_ahead):
        prefill_chunk's rule, at most settings.warm_chunk so that a cancel is seen."""
        chunk = prefill_chunk(self.model, n_new, self.settings.small_prefill_rows)
        return min(chunk, max(1, int(self.settings.warm_chunk)))

    def warm(self, cancel: threading.Event | None = None) -> dict:
        """Compute the cache for the conversation as it stands (e.g. a reopened chat without
        a usable saved session, while the user types), in chunks of settings.warm_chunk rows
        so that `cancel` stops it between chunks. Returns {"reused", "computed", "ms",
        "vision_ms", "cancelled"}."""
        t0 = time.perf_counter()
        msgs = self._messages
        if not msgs and not self.system:  # nothing to render (a template needs a message)
            return {"reused": 0, "computed": 0, "ms": 0.0, "vision_ms": 0.0, "cancelled": False}
        gen_prompt = bool(msgs) and msgs[-1].role == "user"
        reserve = max(1, self.settings.answer_reserve)
        dropped, p, _ = self._fit(msgs, set(self._dropped), reserve, gen_prompt)
        self._dropped = dropped
        reuse, inputs = self._start(p, need_logits=False)
        try:
            prefill(self.model, self.cache, p, reuse, images=inputs, logits=False,
                    chunk=self._ahead_chunk(len(p.ids) - reuse), cancel=cancel)  # fmt: skip
        finally:
            self._commit(p, [])
        return {
            "reused": reuse,
            "computed": self.cache.length - reuse,
            "ms": (time.perf_counter() - t0) * 1e3,
            "vision_ms": inputs.vision_ms if inputs is not None else 0.0,
            "cancelled": self.cache.length < len(p.ids),
        }

    def prefill_ahead(self, images, cancel: threading.Event | None = None) -> dict:
        """Compute, while the user types, the rows that the next user turn starting with
        `images` shares with whatever text it will carry: the conversation as it stands, the
        turn's opening and the images (encoded first when their embeddings are not cached),
        up to the first row where two different texts render differently. The turn that
        sends them then finds these rows as its reusable prefix and prefills only its text
        (an image question's time to first token, docs/vision.md). Nothing is recorded in
        the conversation. Returns {"reused", "computed", "ms", "vision_ms", "cancelled"}."""
        t0 = time.perf_counter()
        images = [self.image(im) for im in images]
        msgs = self._messages
        reserve = max(1, self.settings.answer_reserve)
        drafts = [self._normalize([*msgs, Message("user", t, images)]) for t in ("a", "b")]
        dropped, p, _ = self._fit(drafts[0], set(self._dropped), reserve, False)
        other = self._render(drafts[1], dropped, generation_prompt=False)
        n = 0
        while n < min(len(p.ids), len(other.ids)) and p.ids[n] == other.ids[n]:
            n += 1
        for sp in p.spans:
            if sp.start < n < sp.end:  # never part of an image
                n = sp.start
        spans = [sp for sp in p.spans if sp.end <= n]
        head = Prompt(p.ids[:n], p.positions[:, :n], p.rope_delta,
                      p.images[: len(spans)], spans)  # fmt: skip
        self._sync_images(cancel)
        try:
            reuse, inputs = self._start(head, need_logits=False)  # encodes what is missing
        finally:
            self.images.cancel = None
        try:
            prefill(self.model, self.cache, head, reuse, images=inputs, logits=False,
                    chunk=self._ahead_chunk(n - reuse), cancel=cancel)  # fmt: skip
        finally:
            self._commit(head, [])
        return {
            "reused": reuse,
            "computed": self.cache.length - reuse,
            "ms": (time.perf_counter() - t0) * 1e3,
            "vision_ms": inputs.vision_ms if inputs is not None else 0.0,
            "cancelled": self.cache.length < n,
        }

    # ---- saving and restoring ------------------------------------------------------------------

    def _rows(self) -> CachedRows:
        return CachedRows(self.cache, self._tokens, self._positions, self._rope_delta, self._spans)

    def _saved_images(self) -> set[str]:
        used = {im.hash for m in self._messages for im in m.images}
        return {h for h in used if h in self._embeddings}

    def _file(self):
        images = self._saved_images()
        meta = persistence.file_meta(
            self.model, self.system, self._messages, self._dropped,
            self.settings.context_budget, self._rows(), images,
        )  # fmt: skip
        return meta, persistence.file_arrays(self._rows(), self._embeddings, images)

    def _images_need_no_pixels(self) -> None:
        """Images of messages whose embeddings came from the file need no pixels."""
        for m in self._messages:
            for im in m.images:
                if im.hash in self._embeddings:
                    im.prepared = None

    def estimated_file_bytes(self) -> int:
        return arrayfile.estimate_size(*self._file())

    def save(self, path: Path | str) -> int:
        """Write the session (messages, tokens, positions and rope state, KV cache, image
        embeddings) atomically; returns the file size. Raises arrayfile.FileSaveError (a
        MerlinError) when the disk is full or the folder cannot be written: the previous
        file, if any, is untouched and the session in memory is unaffected."""
        chars = sum(len(m.text) for m in self._messages)
        if chars > MAX_SAVED_TEXT_CHARS:  # a file its reader would refuse (session_check)
            raise arrayfile.FileSaveError(
                f"the conversation holds {chars:,} characters; a session file keeps at most "
                f"{MAX_SAVED_TEXT_CHARS:,}, so it was not saved. Start a new chat to save again."
            )
        meta, arrays = self._file()
        return arrayfile.write(path, SESSION_KIND, meta, arrays)

    @classmethod
    def open(cls, model, path, settings=None, system: str | None = None):
        """A session continued from a file: its messages and, when the file matches this
        model, its cache. An unusable file gives an empty session (result.reason says why);
        a file for another model still gives its messages, recomputed on the next turn.
        Returns (session, RestoreResult)."""
        s = cls(model, system or "", settings)
        result = s.restore(path, load_messages=True)
        if system is not None:
            s.system = system
        return s, result

    def restore(self, path: Path | str, load_messages: bool = False) -> RestoreResult:
        """Use a saved session's cache (and with load_messages, its system prompt and
        messages). Never raises for a bad file: a missing, foreign, truncated, damaged or
        mismatching file leaves the cache as it was and result.reason says why (logged).
        The session's messages need not equal the file's: the next turn reuses the common
        prefix (and the file's ids of the answers they share)."""
        t0 = time.perf_counter()
        result, saved, rows, kept = persistence.read_session(self.model, path, self.budget)
        if saved is not None and load_messages:
            self.system = saved.system
            # a file saved with another model holds its tokenizer's ids: the text is encoded
            self._messages = [
                m if m.ids is None or self._spells(m.ids, m.text) else replace(m, ids=None)
                for m in saved.messages
            ]
            # left out under this budget: still so; under another, the budget decides afresh
            same = saved.context_budget == self.settings.context_budget
            self._dropped = {i for i in saved.dropped if i < len(saved.messages)} if same else set()
            self._reset_cache()
            result.messages_loaded = True
        if rows is None:
            self._embeddings.update(kept)  # intact pictures of a damaged file: no pixels needed
            self._images_need_no_pixels()
            self._prune_embeddings()
            return result
        self.cache = rows.cache
        self._tokens, self._positions, self._spans = rows.tokens, rows.positions, rows.spans
        self._rope_delta = rows.rope_delta
        self._embeddings.update(rows.embeddings)
        self.drafter.reset(rows.tokens)
        if not load_messages:
            n = common_prefix(saved.messages, self._messages)
            same = saved.system == self.system
            same = same and saved.context_budget == self.settings.context_budget
            if saved.dropped and max(saved.dropped) < n and same:
                self._dropped = set(saved.dropped)
            self._messages = adopt_ids(saved.messages, self._messages)
        self._images_need_no_pixels()
        self._prune_embeddings()
        try:
            os.utime(path)  # recently used (SessionStore evicts the least recently used)
        except OSError:
            pass
        result.restored = True
        result.tokens = len(rows.tokens)
        result.ms = (time.perf_counter() - t0) * 1e3
        return result


def _offsets_in(raw: str, text: str, offsets, n_images: int, index: int) -> tuple[int, ...]:
    """A message's image offsets into `raw` -> into `text`, what check_user_text made of it
    (a surrogate pair it joins moves the offsets after it); InputError when they do not fit."""
    try:
        offsets = tuple(int(o) for o in offsets)
        if text != raw:
            offsets = offsets_after_check(raw, offsets)
        return check_offsets(offsets, n_images, len(text))
    except (TypeError, ValueError) as e:
        raise InputError(f"message {index}: {e}.") from None


def _just(event) -> Iterator:
    """A one-event stream (closable like generate()'s)."""
    yield event
