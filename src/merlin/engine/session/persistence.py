"""Saved sessions: what a session file holds, writing it, and reading it back checked.

A session file is an engine.arrayfile file (versioned, checksummed, atomic writes) of kind
SESSION_KIND. Its metadata: the checkpoint identity (config hash, a fingerprint of the weight
files, weights format, KV format, KV dimensions) and SESSION_FORMAT, the system prompt, the
messages (answers with the ids they were generated as), which messages were left out, the KV
cache description, rope delta and image spans. Its arrays: the KV cache, the token ids and 3D
positions of the cached rows, the embeddings of the images the messages use. A file that does
not match the model, or is damaged, is never used: `read` says why in a sentence (logged by
the session), and the conversation is recomputed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import arrayfile, file_sample, session_check
from ..kv_cache import KVCache
from ..prompt import ImageSpan
from ..version import __version__
from .conversation import Message
from .images import ImageEmbedding

log = logging.getLogger("merlin.engine.session")

SESSION_KIND = "merlin-session"
# bump when what a session file holds, or how it is computed, changes
# 2: answers keep the ids they were generated as, and the cached rows are those ids
SESSION_FORMAT = 2


@dataclass
class RestoreResult:
    restored: bool  # the saved KV cache is in use: the next turn prefills only what is new
    reason: str = ""  # why not (empty when restored)
    tokens: int = 0  # tokens restored
    file_bytes: int = 0
    ms: float = 0.0
    messages_loaded: bool = False  # messages came from the file (Session.open)
    images_kept: int = 0  # image embeddings kept from a file whose cache was not usable


@dataclass
class CachedRows:
    """What the KV cache holds: its rows' token ids, 3D positions, image spans."""

    cache: KVCache
    tokens: list[int]
    positions: np.ndarray  # [3, n] int64
    rope_delta: int
    spans: list[ImageSpan]
    embeddings: dict[str, ImageEmbedding] = field(default_factory=dict)


FINGERPRINT_VERSION = "2:"  # how the fingerprint is made; files of another say so


def checkpoint_fingerprint(model) -> str:
    """The weight files' names, sizes, times and sampled bytes (file_sample.py): a different
    checkpoint with the same config.json (a fine-tune, e.g. a merged LoRA, whose header,
    embeddings and vision tower are the base model's) gets another fingerprint, at a few MiB
    read a file. A copied folder gets another one too (its times): its sessions are
    recomputed once. Memoised on the model."""
    cached = model.__dict__.get("_session_fingerprint")
    if cached:
        return cached
    value = (
        FINGERPRINT_VERSION
        + file_sample.digest(sorted(Path(model.folder).glob("*.safetensors")))[:16]
    )
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


def same_vision_tower(saved, current: dict) -> bool:
    """Whether a session saved with `saved` identity holds image embeddings this model would
    make: the same file format, config and weight files (the text weights' and KV cache's
    formats do not enter an embedding; its vision format is in its key: images.py _salt)."""
    keys = ("format", "config", "checkpoint")
    return isinstance(saved, dict) and all(saved.get(k) == current[k] for k in keys)


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
        if not str(saved.get("checkpoint", "")).startswith(FINGERPRINT_VERSION):
            return "an earlier Merlin saved it and identified the weight files another way"
        return "it was saved with other weight files (changed, replaced or copied since)"
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


# ---- writing -----------------------------------------------------------------------------------


def file_meta(model, system, messages, dropped, context_budget, rows: CachedRows, images) -> dict:
    return {
        "identity": model_identity(model),
        "engine": __version__,
        "saved_at": time.time(),
        "system": system,
        "messages": [m.to_json() for m in messages],
        "dropped": sorted(dropped),
        "context_budget": context_budget,
        "cache": rows.cache.describe(),
        "rope_delta": rows.rope_delta,
        "spans": [list(s[:3]) for s in rows.spans],
        "images": sorted(images),
    }


def file_arrays(rows: CachedRows, embeddings: dict, images) -> list[arrayfile.ArraySpec]:
    specs = rows.cache.array_specs("kv.")
    specs.append(arrayfile.array_spec("tokens", np.asarray(rows.tokens, np.int64)))
    specs.append(arrayfile.array_spec("positions", rows.positions.astype(np.int64)))
    for h in sorted(images):
        emb = embeddings[h]
        specs.append(arrayfile.array_spec(f"img.{h}.embeds", emb.embeds))
        specs.append(arrayfile.array_spec(f"img.{h}.deepstack", emb.deepstack))
    return specs


# ---- reading -----------------------------------------------------------------------------------


@dataclass
class SavedConversation:
    system: str
    messages: list[Message]
    dropped: set[int]
    context_budget: int | None = None  # the setting the messages were left out under


def read_conversation(meta: dict, model) -> SavedConversation:
    """The conversation part of a file's metadata; ValueError when unreadable."""
    budget = meta.get("context_budget")
    try:
        return SavedConversation(
            str(meta.get("system") or ""),
            session_check.messages(meta, model),  # every field checked against the model
            {int(i) for i in meta.get("dropped", [])},
            budget if isinstance(budget, int) and not isinstance(budget, bool) else None,
        )
    except (KeyError, TypeError, ValueError):
        raise ValueError("it is damaged (unreadable messages)") from None


def read_rows(model, reader: arrayfile.Reader, meta: dict, budget: int) -> CachedRows:
    """Everything the file holds besides messages, checked; FileFormatError if not."""
    FFE = arrayfile.FileFormatError
    session_check.check_state(model, meta, budget)  # sized from the model, never the file
    desc = meta.get("cache")
    if not isinstance(desc, dict) or desc.get("fmt") != model.kv_fmt:
        raise FFE("it is damaged (KV cache description)")
    try:
        n = int(desc["length"])
        spans = [ImageSpan(int(s), int(e), str(h)) for s, e, h in meta.get("spans", [])]
        images = [str(h) for h in meta.get("images", [])]
        rope_delta = int(meta.get("rope_delta", 0))
    except (KeyError, TypeError, ValueError):
        raise FFE("it is damaged (bad session metadata)") from None
    tokens = reader.read("tokens")
    positions = reader.read("positions")
    if tokens.shape != (n,) or positions.shape != (3, n):
        raise FFE("it is damaged (token history and KV cache disagree)")
    session_check.check_history(tokens, positions)
    vocab = model.config.text.vocab_size
    if n and (tokens.min() < 0 or tokens.max() >= vocab):
        raise FFE("it is damaged (token ids outside the vocabulary)")
    pad = model.config.image_token_id
    for s, e, _, _ in spans:
        if not 0 <= s < e <= n or not np.all(tokens[s:e] == pad):
            raise FFE("it is damaged (image rows do not match the token history)")
    embeddings = {h: read_embedding(model, reader, h) for h in images}
    session_check.check_embeddings(model, meta, spans, embeddings)
    t = model.config.text
    dims = (t.num_hidden_layers, t.num_key_value_heads, t.head_dim)
    cache = KVCache.read_from(reader, desc, budget, "kv.", expect=dims)
    return CachedRows(
        cache, [int(t) for t in tokens], positions.astype(np.int64), rope_delta, spans, embeddings
    )


def read_embedding(model, reader: arrayfile.Reader, h: str) -> ImageEmbedding:
    """Image h's embedding as the file holds it (checksummed, shapes checked against the
    model); FileFormatError if not."""
    embeds = reader.read(f"img.{h}.embeds")
    deep = reader.read(f"img.{h}.deepstack")
    if (
        embeds.ndim != 2
        or embeds.shape[1] != model.config.text.hidden_size
        or deep.ndim != 3
        or deep.shape[1:] != embeds.shape
        or embeds.dtype != np.float32
        or deep.dtype != np.float32
    ):
        raise arrayfile.FileFormatError(f"it is damaged (image embedding {h} has the wrong shape)")
    return ImageEmbedding(embeds, deep)


def salvage_embeddings(model, reader: arrayfile.Reader, meta: dict) -> dict:
    """The image embeddings of a file whose cached rows are unusable (a damaged KV cache, a
    history that does not check) that are intact on their own: each passes its checksum and
    every check read_rows makes of it. Without them a turn whose picture's file is gone
    could not go on, though the file holds what it needs."""
    kept = {}
    try:
        images = [str(h) for h in meta.get("images", [])]
        spans = [(int(s), int(e), str(h)) for s, e, h in meta.get("spans", [])]
    except (TypeError, ValueError):
        return kept
    for h in images:
        try:
            emb = read_embedding(model, reader, h)
            mine = [span for span in spans if span[2] == h]
            session_check.check_embeddings(model, meta, mine, {h: emb})
        except (arrayfile.FileFormatError, KeyError, TypeError, ValueError):
            continue
        kept[h] = emb
    return kept


def read_session(model, path, budget: int):
    """(RestoreResult, SavedConversation or None, CachedRows or None, kept embeddings) of a
    session file for `model`: the conversation whenever it is readable, the cached rows only
    when the file matches the model and is intact; when it matches but its rows are not
    intact, the image embeddings that are intact (salvage_embeddings); when it was saved with
    other text weights or another KV format (same_vision_tower), those too (a picture's file
    may be gone or changed since); else {}.
    Never raises for a bad file; the reason is logged."""
    path = Path(path)
    try:
        reader = arrayfile.Reader(path, SESSION_KIND)
    except arrayfile.FileFormatError as e:
        missing = not path.exists()
        reason = "no saved session" if missing else str(e)
        (log.info if missing else log.warning)(
            "session file %s not used: %s; the conversation is recomputed", path, reason
        )
        return RestoreResult(False, reason), None, None, {}
    with reader:
        meta = reader.meta
        result = RestoreResult(False, file_bytes=reader.size)
        try:
            saved = read_conversation(meta, model)
        except ValueError as e:
            result.reason = str(e)
            log.warning("session file %s not used: %s", path, result.reason)
            return result, None, None, {}
        current = model_identity(model)
        reason = identity_mismatch(meta.get("identity"), current)
        rows, kept = None, {}
        if reason is None:
            try:
                rows = read_rows(model, reader, meta, budget)
            except arrayfile.FileFormatError as e:
                reason = str(e)
                kept = salvage_embeddings(model, reader, meta)
        elif same_vision_tower(meta.get("identity"), current):  # other text weights or KV:
            # an embedding's key is its picture's pixels, budget and vision format, so it holds
            # for a picture whose file is gone or changed since (either made every turn fail)
            kept = salvage_embeddings(model, reader, meta)
    if reason is not None:
        result.reason = reason
        result.images_kept = len(kept)
        log.warning("session file %s not used: %s; the conversation is recomputed", path, reason)
    return result, saved, rows, kept
