"""A chat session: its messages, and the token history and KV cache they produced, reused
across turns, edits, regenerations and process restarts.

Every turn renders the whole conversation through the checkpoint's chat template (the
rendering is the truth: what a fresh engine would compute), finds the longest prefix that the
KV cache already holds (same token ids, same 3D positions, same images by content hash),
truncates the cache there and prefills only the rest. Image embeddings are kept by content
hash, so an image already encoded is never encoded again, even when the rows around it must
be recomputed (an edit before it, older turns dropped). Positions of the whole conversation
are computed from its start every turn, so the rope delta after an image is always the one a
fresh computation would use.

Typical use (one thread; the app's worker thread):

    session = Session(model, system="You are terse.", settings=SessionSettings(8192))
    for event in session.ask("What is in the picture?", images=["cat.jpg"]):
        ...  # ContextTrimmed?, PrefillDone(n_tokens computed, reused), Tokens..., Finished
    for event in session.ask("And its colour?"):  # prefills only the new turn
        ...
    session.save(path)                       # or SessionStore(...).save(session, chat_id)
    session2, result = Session.open(model, path)   # result.restored, result.reason

The app can also stay declarative: `session.respond(messages)` with the whole conversation
as it stores it (ending with the user's question); edits and regenerations then need no
special calls, the common prefix is found either way.

Saved sessions are engine.arrayfile files (versioned, checksummed, atomic writes) whose
metadata records the checkpoint identity (config hash, a fingerprint of the weight files,
weights format, KV format, KV dimensions) and SESSION_FORMAT; a file that does not match is
ignored with a logged reason and the conversation is recomputed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import arrayfile
from .errors import InputError, MerlinError, TokenizerError
from .generate import Finished, GenerationRequest, PrefillDone, Tokens, generate
from .kv_cache import KVCache
from .prompt import check_user_text
from .rope import mrope_positions, text_positions
from .sampling import SamplingParams
from .speculative import Drafter
from .tokenizer import expand_image_pads
from .version import __version__

log = logging.getLogger(__name__)

SESSION_KIND = "merlin-session"
SESSION_FORMAT = 1  # bump when what a session file holds, or how it is computed, changes
SESSION_SUFFIX = ".msession"
DEFAULT_STORE_CAP = 4 * 1024**3
# a temporary file of a save (engine.arrayfile) not written to for this long was left by a
# process that died mid-write (kill -9, power cut); SessionStore deletes it
STALE_TEMP_SECONDS = 600


# ---- data --------------------------------------------------------------------------------------


@dataclass
class SessionSettings:
    context_budget: int = 0  # tokens the conversation may use (0: the model's maximum)
    answer_reserve: int = 512  # tokens kept free for the answer when deciding what fits
    trim_fraction: float = 0.75  # when older turns must go, drop until this full (fewer redos)
    max_pixels: int | None = None  # legacy pixel budget, used when image_tokens is None
    # image-token budget per image (None: max_pixels, else the machine class's default;
    # engine/vision/budget.py); an image may carry its own (vision.budget.BudgetedImage)
    image_tokens: int | None = None
    warm_chunk: int = 512  # rows per forward in warm() (cancellable between chunks)
    # row-major q8 weights (engine.linear.prefill_dequantizes): a suffix of up to this many
    # rows is prefilled as forwards of engine.linear.SMALL_N rows, beyond it as one forward
    small_prefill_rows: int = 128


@dataclass
class SessionImage:
    """An image of a conversation. hash: SHA-256 of the prepared pixels and grid, so the same
    picture at another pixel budget is another image. prepared: the pixels (dropped once the
    embedding is cached; re-prepared from `source` if ever needed again)."""

    hash: str
    grid_thw: tuple[int, int, int]
    merge_size: int
    source: str = ""
    prepared: object | None = field(default=None, repr=False, compare=False)
    budget: str = ""  # the budget it was prepared with (vision.budget.resolve's tag)

    @property
    def n_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size * self.merge_size)

    def to_json(self) -> dict:
        return {
            "hash": self.hash,
            "grid_thw": list(self.grid_thw),
            "merge_size": self.merge_size,
            "source": self.source,
            "budget": self.budget,
        }

    @classmethod
    def from_json(cls, d: dict) -> SessionImage:
        return cls(
            str(d["hash"]),
            tuple(int(v) for v in d["grid_thw"]),
            int(d["merge_size"]),
            str(d.get("source", "")),
            budget=str(d.get("budget", "")),
        )


@dataclass
class Message:
    """One turn. images (user turns only): file paths, PIL images, PreparedImage or
    SessionImage; the session turns them into SessionImage."""

    role: str  # "user" | "assistant"
    text: str
    images: list = field(default_factory=list)

    @classmethod
    def user(cls, text: str, images: Iterable = ()) -> Message:
        return cls("user", text, list(images))

    @classmethod
    def assistant(cls, text: str) -> Message:
        return cls("assistant", text)

    def key(self) -> tuple:
        return (
            self.role,
            self.text,
            tuple(im.hash if isinstance(im, SessionImage) else id(im) for im in self.images),
        )

    def to_json(self) -> dict:
        return {
            "role": self.role,
            "text": self.text,
            "images": [im.to_json() for im in self.images],
        }

    @classmethod
    def from_json(cls, d: dict) -> Message:
        role, text = d["role"], d["text"]
        if role not in ("user", "assistant") or not isinstance(text, str):
            raise ValueError("bad message")
        return cls(role, text, [SessionImage.from_json(i) for i in d.get("images", [])])


@dataclass
class ImageEmbedding:
    embeds: np.ndarray  # [n, D] rows replacing the image pads
    deepstack: np.ndarray  # [levels, n, D] added after decoder layers 0, 1, ...


@dataclass
class ContextTrimmed:
    """Event: older messages were left out of what the model sees (they stay in the chat)."""

    dropped: list[int]  # indexes into session.messages, newly left out by this turn
    dropped_tokens: int  # tokens the conversation shrank by
    context_tokens: int  # tokens of the conversation the model now sees (with the question)
    notice: str  # a sentence to show in the chat


@dataclass
class RestoreResult:
    restored: bool  # the saved KV cache is in use: the next turn prefills only what is new
    reason: str = ""  # why not (empty when restored)
    tokens: int = 0  # tokens restored
    file_bytes: int = 0
    ms: float = 0.0
    messages_loaded: bool = False  # messages came from the file (Session.open)


@dataclass
class SaveResult:
    saved: bool
    path: Path | None = None
    file_bytes: int = 0
    ms: float = 0.0
    reason: str = ""  # why not (a sentence to show or log)


@dataclass
class StoreUsage:
    bytes: int
    files: int
    cap_bytes: int
    folder: Path


@dataclass
class _Rendered:
    ids: list[int]
    positions: np.ndarray  # [3, N] int64
    rope_delta: int
    spans: list[tuple[int, int, str]]  # (start, end, image hash) per image, in order
    images: list[SessionImage]


# ---- helpers -----------------------------------------------------------------------------------


def image_hash(prepared, budget: str = "") -> str:
    """Content hash of the prepared pixels and grid, and of the budget tag (which holds the
    image-token budget and the vision weights format: another embedding for the same pixels)."""
    h = hashlib.sha256()
    h.update(repr((tuple(prepared.grid_thw), prepared.merge_size)).encode())
    if budget:
        h.update(budget.encode())
    h.update(memoryview(np.ascontiguousarray(prepared.pixel_values, np.float32)).cast("B"))
    return h.hexdigest()[:32]


def checkpoint_fingerprint(model) -> str:
    """Names, sizes, first and last MiB of the weight files: a different checkpoint with the
    same config.json (a fine-tune) gets another fingerprint. Memoised on the model."""
    cached = model.__dict__.get("_session_fingerprint")
    if cached:
        return cached
    h = hashlib.sha256()
    mib = 1 << 20
    for p in sorted(Path(model.folder).glob("*.safetensors")):
        size = p.stat().st_size
        h.update(f"{p.name}:{size};".encode())
        try:
            with open(p, "rb") as f:
                h.update(f.read(mib))
                if size > 2 * mib:
                    f.seek(size - mib)
                    h.update(f.read(mib))
        except OSError:
            pass
    value = h.hexdigest()[:16]
    model.__dict__["_session_fingerprint"] = value
    return value


def model_identity(model) -> dict:
    """What a saved session must match to be used with `model`."""
    t = model.config.text
    return {
        "format": SESSION_FORMAT,
        "config": model.config.identity,
        "checkpoint": checkpoint_fingerprint(model),
        "weights": model.weights_fmt,
        "kv": model.kv_fmt,
        "kv_dims": [t.num_hidden_layers, t.num_key_value_heads, t.head_dim],
    }


def identity_mismatch(saved: dict, current: dict) -> str | None:
    """A sentence saying why a saved session cannot be used, or None."""
    if not isinstance(saved, dict):
        return "it records no model identity"
    if saved.get("format") != current["format"]:
        return (
            f"it is session format {saved.get('format')}; this Merlin "
            f"({__version__}) uses format {current['format']}"
        )
    if saved.get("config") != current["config"]:
        return "it was saved with another model (config.json differs)"
    if saved.get("checkpoint") != current["checkpoint"]:
        return "it was saved with other weight files (the checkpoint changed)"
    if saved.get("weights") != current["weights"]:
        return (
            f"it was saved with {saved.get('weights')} weights; the model now runs "
            f"{current['weights']} weights"
        )
    if saved.get("kv") != current["kv"]:
        return (
            f"it holds a {saved.get('kv')} KV cache; the model now uses a {current['kv']} KV cache"
        )
    if list(saved.get("kv_dims") or []) != current["kv_dims"]:
        return "its KV cache has other dimensions"
    return None


def _common_prefix(a: Sequence[Message], b: Sequence[Message]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x.key() != y.key():
            break
        n += 1
    return n


# ---- the session -------------------------------------------------------------------------------


class Session:
    """One conversation with a loaded model. Not thread-safe: use it from one thread."""

    def __init__(self, model, system: str = "", settings: SessionSettings | None = None):
        self.model = model
        self.system = system or ""
        self.settings = settings or SessionSettings()
        self._messages: list[Message] = []
        self._dropped: set[int] = set()
        self._embeddings: dict[str, ImageEmbedding] = {}
        self._image_memo: dict[tuple, SessionImage] = {}
        self.vision_progress = None  # called (blocks done, depth) while an image is encoded
        self._reset_cache()

    # ---- state ---------------------------------------------------------------------------------

    def _reset_cache(self) -> None:
        cfg = self.model.config
        self.cache: KVCache = self.model.new_cache(self.budget)
        self._tokens: list[int] = []  # ids of the cached rows (len == cache.length)
        self._positions = np.zeros((3, 0), np.int64)  # their 3D positions
        self._rope_delta = 0  # decode position = cache index + this (after the prompt)
        self._spans: list[tuple[int, int, str]] = []  # cached image rows
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

    def set_system(self, system: str) -> None:
        self.system = system or ""

    def set_messages(self, messages: Sequence[Message]) -> None:
        """Replace the conversation (e.g. with the app's stored chat). Nothing is computed now;
        the next turn reuses whatever prefix the cache holds."""
        messages = self._normalize(messages)
        keep = _common_prefix(self._messages, messages)
        self._dropped = {i for i in self._dropped if i < keep}
        self._messages = messages
        self._prune_embeddings()

    def drop_cache(self, keep_tokens: int = 0) -> None:
        """Release the cached rows from keep_tokens on (e.g. to free memory for another
        chat); the conversation is kept and the next turn recomputes what is missing."""
        self._truncate(max(0, min(int(keep_tokens), self.cache.length)))
        if self.cache.length == 0:
            self._reset_cache()

    def reset(self) -> None:
        """Forget the conversation and the cache (the embeddings too)."""
        self._messages, self._dropped, self._embeddings = [], set(), {}
        self._reset_cache()

    # ---- images --------------------------------------------------------------------------------

    def image(self, image) -> SessionImage:
        """A path, PIL image, PreparedImage or SessionImage -> SessionImage (prepared now with
        the session's pixel budget; InputError naming the file when it is unusable)."""
        if isinstance(image, SessionImage):
            if image.prepared is None and image.hash not in self._embeddings and image.source:
                # neither pixels nor embedding (a session restored without its cache):
                # prepare the file again now, so the rendering uses its current grid
                try:
                    fresh = self.image(image.source)
                except MerlinError:
                    return image  # the embedding step says what is missing, if needed
                if fresh.hash != image.hash:
                    log.info("image %s prepared again differs from the saved one", image.source)
                return fresh
            return image
        vision = self.model.vision
        if vision is None:
            raise InputError("this model has no vision encoder; remove the image.")
        vision.require()
        max_px, tag = self._image_budget(image)
        if isinstance(image, (str, os.PathLike)):
            path = Path(image).expanduser()
            try:
                st = path.stat()
                key = (str(path.resolve()), st.st_mtime_ns, st.st_size, tag)
            except OSError:
                key = None  # prepare() says what is wrong with the path
            if key in self._image_memo:
                return self._image_memo[key]
            prepared = vision.prepare(path, max_px)
            im = self._wrap(prepared, str(path), tag)
            if key is not None:
                if len(self._image_memo) > 64:
                    self._image_memo.clear()
                self._image_memo[key] = im
            return im
        if hasattr(image, "pixel_values") and hasattr(image, "grid_thw"):
            return self._wrap(image, getattr(image, "source", ""))
        try:
            from PIL import Image
        except ImportError:  # pragma: no cover
            Image = None
        if Image is not None and isinstance(image, Image.Image):
            from .vision import prepare_pil

            cfg = vision.preprocess.with_max_pixels(max_px)
            return self._wrap(prepare_pil(image, cfg, "image"), "image", tag)
        raise InputError(f"cannot use {type(image).__name__} as an image; give a file path.")

    def _image_budget(self, image) -> tuple[int | None, str]:
        """(max_pixels, hash tag) for an image: engine/vision/budget.resolve, plus the vision
        weights format in the tag (q8 and f32 embeddings differ)."""
        from .vision import budget

        own = getattr(image, "tokens", None) if isinstance(image, budget.BudgetedImage) else None
        vision = self.model.vision
        max_px, tag = budget.resolve(
            vision.preprocess,
            own,
            self.settings.image_tokens,
            self.settings.max_pixels,
            self.budget,
        )
        return max_px, f"{tag}/{vision.weights_format}"

    def _wrap(self, prepared, source: str, tag: str = "") -> SessionImage:
        im = SessionImage(
            image_hash(prepared, tag),
            tuple(int(v) for v in prepared.grid_thw),
            int(prepared.merge_size),
            str(source),
            prepared,
            budget=tag,
        )
        if tag:  # a picture whose tokens alone exceed the context: refused before encoding
            from .vision.budget import check_image_fits

            check_image_fits(im.n_tokens, self.budget, self.model.vision.preprocess, source)
        return im

    def encode_image(self, image, cancel: threading.Event | None = None) -> SessionImage:
        """Prepare and encode an image now (e.g. when it is attached, while the user types),
        so that the turn that sends it finds its embedding (in this session or, through
        model.vision.embeddings, in another one). EncodeCancelled if `cancel` is set."""
        im = self.image(image)
        self._embedding(im, cancel)
        return im

    def _normalize(self, messages: Sequence[Message]) -> list[Message]:
        out = []
        for i, m in enumerate(messages):
            if isinstance(m, dict):
                m = Message(m.get("role"), m.get("text", ""), list(m.get("images", [])))
            if m.role not in ("user", "assistant"):
                raise InputError(f"message {i}: role must be 'user' or 'assistant'.")
            if not isinstance(m.text, str):
                raise InputError(f"message {i}: text must be a string.")
            if m.images and m.role != "user":
                raise InputError(f"message {i}: only user messages can have images.")
            # what a person typed: lone surrogates cleaned, a huge paste refused before the
            # tokenizer sees it (engine.prompt.check_user_text, as build_prompt does)
            text = check_user_text(m.text) if m.role == "user" else m.text
            out.append(Message(m.role, text, [self.image(im) for im in m.images]))
        return out

    def _embedding(self, im: SessionImage, cancel=None) -> ImageEmbedding:
        emb = self._embeddings.get(im.hash)
        if emb is None:
            emb = self.model.vision.embeddings.get(im.hash)  # encoded when it was attached
            if emb is not None:
                self._embeddings[im.hash] = emb
        if emb is not None:
            return emb
        prepared = im.prepared
        if prepared is None:
            prepared = self._reprepare(im)
        out = self.model.vision.encode([prepared], cancel, self.vision_progress)
        if out.embeds.shape[0] != im.n_tokens:
            raise MerlinError(
                f"the vision encoder gave {out.embeds.shape[0]} rows for an image of "
                f"{im.n_tokens} tokens."
            )
        deep = (
            np.stack(out.deepstack)
            if out.deepstack
            else np.zeros((0, *out.embeds.shape), np.float32)
        )
        emb = ImageEmbedding(out.embeds, deep)
        self._embeddings[im.hash] = emb
        self.model.vision.embeddings.put(im.hash, emb)
        im.prepared = None  # the pixels are not needed while the embedding is kept
        return emb

    def _reprepare(self, im: SessionImage):
        """Pixels of an image whose embedding is not cached (e.g. a session restored from
        another model's file): prepared again from its file, which must be unchanged."""
        if not im.source or not Path(im.source).is_file():
            raise InputError(
                f"the image {im.source or '(unnamed)'} of this conversation is needed again "
                "but its file is gone and no saved copy could be used. Attach it again in a "
                "new message, or start a new chat."
            )
        max_px = self.settings.max_pixels
        if im.budget.startswith("t"):
            factor = self.model.vision.preprocess.factor
            max_px = int(im.budget[1:].split("/")[0]) * factor * factor
        elif im.budget.startswith("px"):
            max_px = int(im.budget[2:].split("/")[0])
        prepared = self.model.vision.prepare(im.source, max_px)
        if image_hash(prepared, im.budget) != im.hash:
            raise InputError(
                f"the image {im.source} changed on disk since it was attached to this "
                "conversation. Attach it again in a new message, or start a new chat."
            )
        return prepared

    def _prune_embeddings(self) -> None:
        used = {im.hash for m in self._messages for im in m.images}
        for h in list(self._embeddings):
            if h not in used:
                del self._embeddings[h]

    # ---- rendering and reuse -------------------------------------------------------------------

    def _render(
        self, messages: Sequence[Message], dropped: set[int], generation_prompt: bool = True
    ) -> _Rendered:
        chat = [{"role": "system", "content": self.system}] if self.system else []
        images: list[SessionImage] = []
        for i, m in enumerate(messages):
            if i in dropped:
                continue
            if m.role == "user":
                content = [{"type": "image"} for _ in m.images]
                content.append({"type": "text", "text": m.text})
                images += m.images
                chat.append({"role": "user", "content": content})
            else:
                chat.append({"role": "assistant", "content": m.text})
        tok, cfg = self.model.tokenizer, self.model.config
        ids = tok.encode_chat(chat, add_generation_prompt=generation_prompt)
        pad = cfg.image_token_id
        if not images:
            return _Rendered(ids, text_positions(0, len(ids)), 0, [], [])
        if tok.token_id("<|image_pad|>") != pad:
            raise TokenizerError(
                f"the tokenizer's <|image_pad|> is id {tok.token_id('<|image_pad|>')} but "
                f"config.json says image_token_id {pad}; tokenizer and weights do not belong "
                "together."
            )
        ids = expand_image_pads(ids, pad, [im.n_tokens for im in images])
        positions, delta = mrope_positions(
            ids, pad, [im.grid_thw for im in images], images[0].merge_size
        )
        rows = np.flatnonzero(np.asarray(ids) == pad)
        spans, o = [], 0
        for im in images:
            s = int(rows[o])
            spans.append((s, s + im.n_tokens, im.hash))
            o += im.n_tokens
        return _Rendered(ids, positions, delta, spans, images)

    def _reuse_point(self, r: _Rendered, need_logits: bool = True) -> int:
        """Rows of the cache that equal the start of the rendered conversation: same ids,
        same 3D positions, same images. With need_logits at most N - 1 (the last row is fed
        again for its logits)."""
        m = min(len(self._tokens), len(r.ids))
        a = np.asarray(self._tokens[:m], np.int64)
        b = np.asarray(r.ids[:m], np.int64)
        diff = np.flatnonzero(a != b)
        lcp = int(diff[0]) if diff.size else m
        bad = np.flatnonzero((self._positions[:, :lcp] != r.positions[:, :lcp]).any(axis=0))
        if bad.size:
            lcp = int(bad[0])
        new = {s: (e, h) for s, e, h in r.spans}
        for s, e, h in self._spans:
            if s >= lcp:
                break
            if new.get(s) != (e, h):
                lcp = s
                break
        old = {s for s, _, _ in self._spans}
        for s, _, _ in r.spans:
            if s < lcp and s not in old:
                lcp = s
                break
        return min(lcp, len(r.ids) - 1) if need_logits else lcp

    def _truncate(self, n: int) -> None:
        for s, e, _ in self._spans:
            if s < n < e:  # never keep part of an image
                n = s
                break
        n = min(n, self.cache.length)
        self.cache.truncate(n)
        self._tokens = self._tokens[:n]
        self._positions = self._positions[:, :n]
        self._spans = [sp for sp in self._spans if sp[1] <= n]

    def _image_inputs(self, r: _Rendered, start: int, cancel=None):
        """Embedding rows for the image tokens at rows start.. of the rendered conversation."""
        from .vision.model import ImageInputs

        t0 = time.perf_counter()
        rows, embeds, deep = [], [], []
        for (s, e, _), im in zip(r.spans, r.images):
            if e <= start:
                continue
            emb = self._embedding(im, cancel)
            a = max(s, start)
            rows.append(np.arange(a - start, e - start, dtype=np.int64))
            embeds.append(emb.embeds[a - s :])
            deep.append(emb.deepstack[:, a - s :])
        if not rows:
            return None
        deepstack = np.concatenate(deep, axis=1)
        return ImageInputs(
            embeds=np.ascontiguousarray(np.concatenate(embeds)),
            rows=np.concatenate(rows),
            deepstack=[np.ascontiguousarray(d) for d in deepstack],
            vision_ms=(time.perf_counter() - t0) * 1e3,
            output=None,
        )

    def _sync_drafter(self, ids: list[int]) -> None:
        h = self.drafter.history
        if len(h) <= len(ids) and h == ids[: len(h)]:
            self.drafter.extend(ids[len(h) :])
        else:
            self.drafter.reset(ids)

    def _commit(self, r: _Rendered, emitted: list[int]) -> None:
        """The cache holds rows 0..cache.length-1 of ids + emitted: record what they are."""
        n_prompt = len(r.ids)
        seq = r.ids + list(emitted)
        n = min(self.cache.length, len(seq))
        self.cache.truncate(n)
        self._tokens = seq[:n]
        head = r.positions[:, : min(n, n_prompt)]
        if n > n_prompt:
            head = np.concatenate(
                [head, text_positions(n_prompt, n - n_prompt, r.rope_delta)], axis=1
            )
        self._positions = np.ascontiguousarray(head)
        self._rope_delta = r.rope_delta
        self._spans = [sp for sp in r.spans if sp[1] <= n]
        for s, e, _ in r.spans:
            if s < n < e:
                self._truncate(s)

    # ---- context budget ------------------------------------------------------------------------

    def _fit(
        self, messages: list[Message], dropped: set[int], reserve: int, gen_prompt: bool = True
    ) -> tuple[set[int], _Rendered, ContextTrimmed | None]:
        """Leave older turns out until the conversation plus `reserve` answer tokens fits the
        budget (system prompt, the current question and the latest image are always kept)."""
        budget = self.budget
        r = self._render(messages, dropped, gen_prompt)
        if len(r.ids) + reserve <= budget:
            return dropped, r, None
        # units: a user message and the replies after it; the last unit is the question
        units: list[list[int]] = []
        for i, m in enumerate(messages):
            if m.role == "user" or not units:
                units.append([i])
            else:
                units[-1].append(i)
        last = units[-1] if units else []
        protected: list[int] = []
        if not any(messages[i].images for i in last):
            for u in reversed(units[:-1]):
                if any(messages[i].images for i in u):
                    if not all(i in dropped for i in u):
                        protected = u
                    break
        candidates = [
            u for u in units[:-1] if u is not protected and not all(i in dropped for i in u)
        ]

        def with_k(k: int) -> tuple[set[int], _Rendered]:
            d = set(dropped)
            for u in candidates[:k]:
                d.update(u)
            return d, self._render(messages, d, gen_prompt)

        d_all, r_all = with_k(len(candidates))
        limit = budget - reserve
        if len(r_all.ids) > limit:
            kept = [
                w
                for w, c in (("the system prompt", self.system), ("the latest image", r_all.images))
                if c
            ]
            with_ = f" (with {' and '.join(kept)})" if kept else ""
            raise InputError(
                f"this question needs {len(r_all.ids)} tokens{with_}, but the context budget "
                f"is {budget} tokens and {reserve} are kept free for the answer. Shorten the "
                "question"
                + (" or lower the image detail" if r_all.images else "")
                + ", raise the context budget in the settings, or start a new chat."
            )
        goal = min(limit, int(budget * self.settings.trim_fraction))
        if len(r_all.ids) > goal:
            goal = limit
        tried = {len(candidates): (d_all, r_all)}

        def f(k: int) -> tuple[set[int], _Rendered]:
            if k not in tried:
                tried[k] = with_k(k)
            return tried[k]

        lo, hi = 1, len(candidates)  # the fewest units to leave out to reach the goal
        while lo < hi:
            mid = (lo + hi) // 2
            if len(f(mid)[1].ids) <= goal:
                hi = mid
            else:
                lo = mid + 1
        d, rr = f(lo)
        newly = sorted(d - dropped)
        kept_image = " The system prompt and the latest image were kept." if protected else ""
        notice = (
            f"The conversation no longer fits in the context budget of {budget} tokens: the "
            f"{len(newly)} oldest message(s) were left out of what the model sees (they stay "
            f"in the chat).{kept_image}"
        )
        event = ContextTrimmed(newly, len(r.ids) - len(rr.ids), len(rr.ids), notice)
        log.info("%s", notice)
        return d, rr, event

    # ---- turns ---------------------------------------------------------------------------------

    def ask(self, text: str, images: Iterable = (), **gen) -> Iterator:
        """Add a user turn and answer it: see respond() for the options and events."""
        return self.respond([*self._messages, Message("user", text, list(images))], **gen)

    def regenerate(self, **gen) -> Iterator:
        """Answer the last question again (its previous answer is replaced)."""
        msgs = list(self._messages)
        while msgs and msgs[-1].role == "assistant":
            msgs.pop()
        if not msgs:
            raise InputError("there is no question to answer again; type one first.")
        return self.respond(msgs, **gen)

    def edit(self, index: int, text: str, images: Iterable | None = None, **gen) -> Iterator:
        """Replace user message `index` (and drop everything after it), then answer it."""
        if not 0 <= index < len(self._messages) or self._messages[index].role != "user":
            raise InputError(f"message {index} is not a user message of this conversation.")
        old = self._messages[index]
        new = Message("user", text, list(old.images if images is None else images))
        return self.respond([*self._messages[:index], new], **gen)

    def respond(
        self,
        messages: Sequence[Message] | None = None,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 512,
        ignore_eos: bool = False,
        spec: str = "auto",
        spec_k: int = 4,
        cancel: threading.Event | None = None,
    ) -> Iterator:
        """Answer the last message of `messages` (default: the session's), which must be a
        user message. Checks happen now (InputError: empty question, unusable image, a
        question that cannot fit); the work happens while iterating the returned events:

        ContextTrimmed (only when older messages had to be left out), PrefillDone
        (n_tokens = rows computed, reused = rows taken from the cache, vision_ms = encoder
        time, 0 when every image was cached), Tokens..., Finished (totals gain
        reused_tokens, context_tokens, dropped_messages; notices include the trim notice).

        When the events end (any finish reason, or the caller stops iterating), the answer
        so far is the conversation's last assistant message and the cache is consistent
        with it; if computing fails before any token, the conversation is left as it was.
        """
        msgs = self._normalize(self._messages if messages is None else messages)
        if not msgs or msgs[-1].role != "user":
            raise InputError("the conversation must end with a question to answer.")
        if not msgs[-1].text.strip() and not msgs[-1].images:
            raise InputError("the message is empty; type a question first.")
        if max_new_tokens < 1:
            raise InputError("max new tokens must be at least 1.")
        sampling = (sampling or self.model.defaults.sampling).validate()
        keep = _common_prefix(self._messages, msgs)
        dropped = {i for i in self._dropped if i < keep}
        reserve = max(1, min(max_new_tokens, self.settings.answer_reserve))
        dropped, rendered, trimmed = self._fit(msgs, dropped, reserve)
        request = GenerationRequest(
            prompt_ids=[],
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            ignore_eos=ignore_eos,
            spec=spec,
            spec_k=spec_k,
        )
        return self._run(msgs, dropped, rendered, trimmed, request, cancel)

    def _sync_budget(self) -> None:
        """Follow a changed settings.context_budget (the cached prefix stays valid)."""
        budget = self.budget
        if self.cache.max_tokens != budget:
            if self.cache.length > budget:
                self._truncate(budget)
            self.cache.set_budget(budget)

    def _small_chunks(self, n_new: int) -> bool:
        """Prefill n_new rows as forwards of at most SMALL_N rows (the decode kernels) rather
        than one large forward? Row-major q8 weights (linear.prefill_dequantizes) make a
        large forward pay a fixed cost (every weight matrix dequantized to f32 for BLAS) that
        dwarfs a short follow-up; the decode kernels read the quantized weights directly.
        Grouped q4/q8 run those kernels at any N: one forward. A fixed rule (no timing), so
        the same conversation is always computed the same way, bit for bit."""
        from . import linear

        return (
            any(map(linear.prefill_dequantizes, self.model.text.w.matrices()))
            and linear.SMALL_N < n_new <= self.settings.small_prefill_rows
        )

    @staticmethod
    def _slice_inputs(inputs, lo: int, hi: int):
        """Image rows of `inputs` (rows relative to some start) in [lo, hi), rebased to lo."""
        if inputs is None:
            return None
        sel = (inputs.rows >= lo) & (inputs.rows < hi)
        if not sel.any():
            return None
        from .vision.model import ImageInputs

        return ImageInputs(
            embeds=np.ascontiguousarray(inputs.embeds[sel]),
            rows=inputs.rows[sel] - lo,
            deepstack=[np.ascontiguousarray(d[sel]) for d in inputs.deepstack],
            vision_ms=inputs.vision_ms,
            output=None,
        )

    def _forward_rows(self, r: _Rendered, inputs, base: int, lo: int, hi: int) -> None:
        """Feed rows lo..hi-1 of the rendered conversation (inputs: image rows relative to
        base), no logits."""
        part = self._slice_inputs(inputs, lo - base, hi - base)
        kw = {}
        if part is not None:
            kw = dict(embeds=part.embeds, embed_rows=part.rows, deepstack=part.deepstack)
        self.model.text.forward(
            np.asarray(r.ids[lo:hi]), r.positions[:, lo:hi], self.cache, logits="none", **kw
        )

    def _run(self, msgs, dropped, r: _Rendered, trimmed, request, cancel) -> Iterator:
        from . import linear

        self._sync_budget()
        before = (self._messages, self._dropped)
        self._messages, self._dropped = msgs, dropped
        reuse = self._reuse_point(r)
        self._truncate(reuse)
        reuse = self.cache.length
        n = len(r.ids)
        emitted: list[int] = []
        finished = False
        inner = None
        try:
            if trimmed is not None:
                yield trimmed
            from .vision.encoder import EncodeCancelled

            try:
                inputs = self._image_inputs(r, reuse, cancel)
            except EncodeCancelled:  # Stop while an image was encoded: nothing computed
                inputs = None
                cancel.set()
            vision_ms = inputs.vision_ms if inputs is not None else 0.0
            self._sync_drafter(r.ids)
            # all but the last chunk fed here, cancellable between chunks: a short suffix
            # with row-major q8 weights in SMALL_N rows, a long prompt in warm_chunk rows
            start = reuse
            t0 = time.perf_counter()
            chunk = max(1, int(self.settings.warm_chunk))
            if self._small_chunks(n - reuse):
                chunk = linear.SMALL_N
            if n - reuse > chunk or (cancel is not None and cancel.is_set()):
                last = (n - reuse) % chunk or chunk
                while start < n - last or (cancel is not None and cancel.is_set()):
                    if cancel is not None and cancel.is_set():
                        self._finish(r, [], "")
                        finished = True
                        yield Finished(
                            "cancelled",
                            {
                                "prompt_tokens": start - reuse,
                                "generated_tokens": 0,
                                "reused_tokens": reuse,
                                "context_tokens": self.cache.length,
                                "token_ids": [],
                                "text": "",
                                "notices": [trimmed.notice] if trimmed else [],
                                "dropped_messages": sorted(self._dropped),
                            },
                        )
                        return
                    end = min(n - last, start + chunk)
                    self._forward_rows(r, inputs, reuse, start, end)
                    start = end
            early_ms = (time.perf_counter() - t0) * 1e3
            request.prompt_ids = r.ids[start:]
            request.positions = r.positions[:, start:]
            request.rope_delta = r.rope_delta
            request.image_inputs = self._slice_inputs(inputs, start - reuse, n - reuse)
            inner = generate(
                self.model,
                request,
                cache=self.cache,
                max_context=self.budget,
                cancel=cancel,
                drafter=self.drafter,
            )
            for event in inner:
                if isinstance(event, PrefillDone):
                    event.reused = reuse
                    event.n_tokens = n - reuse
                    event.vision_ms = vision_ms
                    event.prefill_ms += early_ms
                elif isinstance(event, Tokens):
                    emitted += event.ids
                elif isinstance(event, Finished):
                    t = event.totals
                    t["prompt_tokens"] = n - reuse
                    t["prefill_ms"] = round(t.get("prefill_ms", 0.0) + early_ms, 3)
                    t["vision_ms"] = round(vision_ms, 3)
                    t["reused_tokens"] = reuse
                    t["context_tokens"] = self.cache.length
                    t["dropped_messages"] = sorted(self._dropped)
                    if trimmed is not None:
                        t.setdefault("notices", []).append(trimmed.notice)
                    self._finish(r, emitted, t.get("text", ""))
                    finished = True
                yield event
        except BaseException:
            if not finished:
                if self.cache.length < n and not emitted:
                    # nothing answered: the conversation is as before, the cache a prefix
                    self._commit(r, [])
                    self._messages, self._dropped = before
                else:
                    self._finish(r, emitted, self.model.tokenizer.decode(emitted))
            raise
        finally:
            if inner is not None:
                inner.close()
        if not finished:  # the loop ended without Finished (should not happen)
            self._finish(r, emitted, self.model.tokenizer.decode(emitted))

    def _finish(self, r: _Rendered, emitted: list[int], text: str) -> None:
        self._commit(r, emitted)
        self._messages = [*self._messages, Message("assistant", text)]
        self._prune_embeddings()

    def warm(self, cancel: threading.Event | None = None) -> dict:
        """Compute the cache for the conversation as it stands (e.g. a reopened chat without
        a usable saved session, while the user types), in chunks of settings.warm_chunk rows
        so that `cancel` stops it between chunks. Returns {"reused", "computed", "ms",
        "vision_ms", "cancelled"}."""
        t0 = time.perf_counter()
        msgs = self._messages
        gen_prompt = bool(msgs) and msgs[-1].role == "user"
        reserve = max(1, self.settings.answer_reserve)
        dropped, r, _ = self._fit(msgs, set(self._dropped), reserve, gen_prompt)
        self._sync_budget()
        self._dropped = dropped
        reuse = self._reuse_point(r, need_logits=False)
        self._truncate(reuse)
        reuse = self.cache.length
        inputs = self._image_inputs(r, reuse)
        vision_ms = inputs.vision_ms if inputs is not None else 0.0
        self._sync_drafter(r.ids)
        from . import linear

        chunk = max(1, int(self.settings.warm_chunk))
        if self._small_chunks(len(r.ids) - reuse):
            chunk = linear.SMALL_N
        done = reuse
        cancelled = False
        try:
            while done < len(r.ids):
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                end = min(len(r.ids), done + chunk)
                self._forward_rows(r, inputs, reuse, done, end)
                done = end
        finally:
            self._commit(r, [])
        return {
            "reused": reuse,
            "computed": done - reuse,
            "ms": (time.perf_counter() - t0) * 1e3,
            "vision_ms": vision_ms,
            "cancelled": cancelled,
        }

    # ---- saving and restoring ------------------------------------------------------------------

    def _file_meta(self) -> dict:
        return {
            "identity": model_identity(self.model),
            "engine": __version__,
            "saved_at": time.time(),
            "system": self.system,
            "messages": [m.to_json() for m in self._messages],
            "dropped": sorted(self._dropped),
            "context_budget": self.settings.context_budget,
            "cache": self.cache.describe(),
            "rope_delta": self._rope_delta,
            "spans": [list(s) for s in self._spans],
            "images": sorted(self._saved_images()),
        }

    def _saved_images(self) -> set[str]:
        used = {im.hash for i, m in enumerate(self._messages) for im in m.images}
        return {h for h in used if h in self._embeddings}

    def _file_arrays(self) -> list[arrayfile.ArraySpec]:
        specs = self.cache.array_specs("kv.")
        specs.append(arrayfile.array_spec("tokens", np.asarray(self._tokens, np.int64)))
        specs.append(arrayfile.array_spec("positions", self._positions.astype(np.int64)))
        for h in sorted(self._saved_images()):
            emb = self._embeddings[h]
            specs.append(arrayfile.array_spec(f"img.{h}.embeds", emb.embeds))
            specs.append(arrayfile.array_spec(f"img.{h}.deepstack", emb.deepstack))
        return specs

    def estimated_file_bytes(self) -> int:
        return arrayfile.estimate_size(self._file_meta(), self._file_arrays())

    def save(self, path: Path | str) -> int:
        """Write the session (messages, tokens, positions and rope state, KV cache, image
        embeddings) atomically; returns the file size. Raises arrayfile.FileSaveError (a
        MerlinError) when the disk is full or the folder cannot be written: the previous
        file, if any, is untouched and the session in memory is unaffected."""
        return arrayfile.write(path, SESSION_KIND, self._file_meta(), self._file_arrays())

    @classmethod
    def open(
        cls,
        model,
        path: Path | str,
        settings: SessionSettings | None = None,
        system: str | None = None,
    ) -> tuple[Session, RestoreResult]:
        """A session continued from a file: its messages and, when the file matches this
        model, its cache. An unusable file gives an empty session (result.reason says why);
        a file for another model still gives its messages, recomputed on the next turn."""
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
        prefix."""
        t0 = time.perf_counter()
        path = Path(path)
        try:
            reader = arrayfile.Reader(path, SESSION_KIND)
        except arrayfile.FileFormatError as e:
            missing = not path.exists()
            reason = "no saved session" if missing else str(e)
            (log.info if missing else log.warning)(
                "session file %s not used: %s; the conversation is recomputed", path, reason
            )
            return RestoreResult(False, reason)
        with reader:
            meta = reader.meta
            result = RestoreResult(False, file_bytes=reader.size)
            try:
                file_messages = [Message.from_json(m) for m in meta["messages"]]
                file_system = str(meta.get("system") or "")
                file_dropped = {int(i) for i in meta.get("dropped", [])}
            except (KeyError, TypeError, ValueError):
                result.reason = "it is damaged (unreadable messages)"
                log.warning("session file %s not used: %s", path, result.reason)
                return result
            if load_messages:
                self.system = file_system
                self._messages = file_messages
                self._dropped = {i for i in file_dropped if i < len(file_messages)}
                self._reset_cache()
                result.messages_loaded = True
            reason = identity_mismatch(meta.get("identity"), model_identity(self.model))
            if reason is None:
                try:
                    state = self._read_state(reader, meta)
                except arrayfile.FileFormatError as e:
                    reason = str(e)
            if reason is not None:
                result.reason = reason
                log.warning(
                    "session file %s not used: %s; the conversation is recomputed", path, reason
                )
                return result
        cache, tokens, positions, spans, embeddings = state
        self.cache = cache
        self._tokens, self._positions, self._spans = tokens, positions, spans
        self._rope_delta = int(meta.get("rope_delta", 0))
        self._embeddings.update(embeddings)
        self.drafter.reset(tokens)
        if not load_messages:
            n = _common_prefix(file_messages, self._messages)
            if file_dropped and max(file_dropped) < n and file_system == self.system:
                self._dropped = set(file_dropped)
        # images of messages whose embeddings came from the file need no pixels
        for m in self._messages:
            for im in m.images:
                if im.hash in self._embeddings:
                    im.prepared = None
        self._prune_embeddings()
        try:
            os.utime(path)  # recently used (SessionStore evicts the least recently used)
        except OSError:
            pass
        result.restored = True
        result.tokens = len(tokens)
        result.ms = (time.perf_counter() - t0) * 1e3
        return result

    def _read_state(self, reader: arrayfile.Reader, meta: dict):
        """Everything the file holds besides messages, checked; FileFormatError if not."""
        FFE = arrayfile.FileFormatError
        desc = meta.get("cache")
        if not isinstance(desc, dict) or desc.get("fmt") != self.model.kv_fmt:
            raise FFE("it is damaged (KV cache description)")
        try:
            n = int(desc["length"])
            spans = [(int(s), int(e), str(h)) for s, e, h in meta.get("spans", [])]
            images = [str(h) for h in meta.get("images", [])]
            int(meta.get("rope_delta", 0))
        except (KeyError, TypeError, ValueError):
            raise FFE("it is damaged (bad session metadata)") from None
        if n > self.budget:
            raise FFE(f"it holds {n} tokens, more than the context budget of {self.budget} tokens")
        tokens = reader.read("tokens")
        positions = reader.read("positions")
        if tokens.shape != (n,) or positions.shape != (3, n):
            raise FFE("it is damaged (token history and KV cache disagree)")
        vocab = self.model.config.text.vocab_size
        if n and (tokens.min() < 0 or tokens.max() >= vocab):
            raise FFE("it is damaged (token ids outside the vocabulary)")
        pad = self.model.config.image_token_id
        for s, e, _ in spans:
            if not 0 <= s < e <= n or not np.all(tokens[s:e] == pad):
                raise FFE("it is damaged (image rows do not match the token history)")
        d = self.model.config.text.hidden_size
        embeddings = {}
        for h in images:
            embeds = reader.read(f"img.{h}.embeds")
            deep = reader.read(f"img.{h}.deepstack")
            if (
                embeds.ndim != 2
                or embeds.shape[1] != d
                or deep.ndim != 3
                or deep.shape[1:] != embeds.shape
                or embeds.dtype != np.float32
                or deep.dtype != np.float32
            ):
                raise FFE(f"it is damaged (image embedding {h} has the wrong shape)")
            embeddings[h] = ImageEmbedding(embeds, deep)
        cache = KVCache.read_from(reader, desc, self.budget, "kv.")
        return cache, [int(t) for t in tokens], positions.astype(np.int64), spans, embeddings


# ---- saved sessions on disk, bounded -----------------------------------------------------------


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def default_store_dir() -> Path:
    env = os.environ.get("MERLIN_SESSION_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("merlin")) / "sessions"


class SessionStore:
    """Saved sessions in one folder, keyed by the app's chat id, kept under a size cap by
    deleting the least recently used (saved or restored) files. Never raises for disk
    trouble: results say what happened, and the reasons are logged."""

    def __init__(self, folder: Path | str | None = None, cap_bytes: int = DEFAULT_STORE_CAP):
        self.folder = Path(folder).expanduser() if folder else default_store_dir()
        self.cap_bytes = int(cap_bytes)

    def path_for(self, key: str) -> Path:
        key = str(key)
        if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}", key):
            key = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self.folder / f"{key}{SESSION_SUFFIX}"

    def _files(self) -> list[Path]:
        try:
            return [p for p in self.folder.glob(f"*{SESSION_SUFFIX}") if p.is_file()]
        except OSError:
            return []

    def usage(self) -> StoreUsage:
        files = self._files()
        total = 0
        for p in files:
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return StoreUsage(total, len(files), self.cap_bytes, self.folder)

    def set_cap(self, cap_bytes: int) -> list[Path]:
        self.cap_bytes = int(cap_bytes)
        return self.enforce_cap()

    def remove_stale_temp_files(self) -> int:
        """Delete what interrupted saves left (`.<name>.<pid>.tmp`, see engine.arrayfile)
        once untouched for STALE_TEMP_SECONDS; a save in progress keeps its file fresh."""
        removed = 0
        try:
            temps = list(self.folder.glob(f".*{SESSION_SUFFIX}.*.tmp"))
        except OSError:
            return 0
        for p in temps:
            try:
                if time.time() - p.stat().st_mtime > STALE_TEMP_SECONDS:
                    p.unlink()
                    removed += 1
            except OSError:
                pass
        return removed

    def enforce_cap(self, keep: Path | None = None, extra: int = 0) -> list[Path]:
        """Delete least recently used files until the folder (plus `extra` bytes about to be
        written) is within the cap; `keep` is never deleted. Returns the deleted paths.
        Leftovers of interrupted saves are removed first."""
        self.remove_stale_temp_files()
        entries = []
        for p in self._files():
            try:
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
            except OSError:
                pass
        entries.sort()
        total = sum(size for _, size, _ in entries) + extra
        removed = []
        for _, size, p in entries:
            if total <= self.cap_bytes:
                break
            if keep is not None and p == keep:
                continue
            try:
                p.unlink()
                total -= size
                removed.append(p)
                log.info("saved session %s deleted to stay under the disk limit", p.name)
            except OSError:
                pass
        return removed

    def save(self, session: Session, key: str) -> SaveResult:
        t0 = time.perf_counter()
        path = self.path_for(key)
        try:
            size = session.estimated_file_bytes()
        except MerlinError as e:
            return SaveResult(False, path, reason=str(e))
        if size > self.cap_bytes:
            reason = (
                f"the session ({format_bytes(size)}) is larger than the saved-session limit "
                f"({format_bytes(self.cap_bytes)}); it was not saved. Raise the limit in the "
                "settings, use a q8 KV cache, or lower the context budget."
            )
            log.warning("%s", reason)
            path.unlink(missing_ok=True)  # a stale older copy would only waste the space
            return SaveResult(False, path, reason=reason)
        old = path.stat().st_size if path.is_file() else 0
        self.enforce_cap(keep=path, extra=max(0, size - old))
        try:
            written = session.save(path)
        except arrayfile.FileSaveError as e:
            reason = f"the session was not saved: {e}. The chat itself is kept."
            log.warning("%s", reason)
            return SaveResult(False, path, reason=reason)
        self.enforce_cap(keep=path)
        return SaveResult(True, path, written, (time.perf_counter() - t0) * 1e3)

    def restore(self, session: Session, key: str) -> RestoreResult:
        return session.restore(self.path_for(key))

    def delete(self, key: str) -> None:
        try:
            self.path_for(key).unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not delete saved session %s: %s", key, e)

    def clear(self) -> int:
        """Delete every saved session; returns the bytes freed."""
        freed = 0
        for p in self._files():
            try:
                size = p.stat().st_size
                p.unlink()
                freed += size
            except OSError:
                pass
        return freed
