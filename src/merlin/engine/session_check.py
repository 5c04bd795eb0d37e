"""Checks of what a saved session file says, against the loaded model, before it sizes or
indexes anything.

A session file is checksummed, but a checksum only proves the file is as written, not that
what it says is sane or fits this model: a crafted (or foreign) file with a valid CRC and the
right identity can describe a KV cache of head_dim 2, 1e7 layers, float offsets, token ids
past the vocabulary, or an image grid of 1e5 x 1e5. The KV cache is always sized from the
MODEL (layers, KV heads, head_dim, format) and the context budget, never from the file; the
file's description must equal it. Everything else (messages, images, spans, positions,
dropped indexes, rope delta) is checked here for type, integrality and range. Every problem
raises arrayfile.FileFormatError (or ValueError for messages, which Session.restore words as
"damaged"), so a bad file is ignored with a reason, never a traceback or an allocation.

`check_target(path)` is for writers: `merlin-cli chat --session FILE` may only replace FILE
when it is one of our session files of a format this Merlin reads.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np

from . import arrayfile
from .errors import InputError
from .prompt import MAX_IMAGES_PER_MESSAGE

FFE = arrayfile.FileFormatError
MAX_MESSAGES = 100_000
MAX_SAVED_TEXT_CHARS = 16 * 1024 * 1024  # all messages of one session (Session.save refuses more)
MAX_POSITION = 1 << 31
_HASH = re.compile(r"[0-9a-f]{8,64}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v, what: str, lo: int, hi: int, error=FFE) -> int:
    if not _is_int(v) or not lo <= v <= hi:
        raise error(
            f"it is damaged ({what} is {str(v)[:40]!r}, expected a whole number from {lo} to {hi})"
        )
    return v


# ---- messages ----------------------------------------------------------------------------------


def image_json(d, model) -> dict:
    """A saved image entry, checked: hash, a (t, h, w) grid of positive ints, the model's merge
    size, a bounded image-token count. Raises ValueError."""
    if not isinstance(d, dict):
        raise ValueError("image entry is not an object")
    h = d.get("hash")
    if not isinstance(h, str) or not _HASH.fullmatch(h):
        raise ValueError("bad image hash")
    grid = d.get("grid_thw")
    if not isinstance(grid, list) or len(grid) != 3 or not all(_is_int(g) and g > 0 for g in grid):
        raise ValueError("bad image grid")
    merge = d.get("merge_size")
    vision = model.config.vision
    want = vision.spatial_merge_size if vision is not None else merge
    if not _is_int(merge) or merge < 1 or merge != want:
        raise ValueError("bad merge size")
    t, gh, gw = grid
    if gh % merge or gw % merge or t > 64:
        raise ValueError("image grid does not match the merge size")
    if t * gh * gw // (merge * merge) > model.max_context:
        raise ValueError("image larger than the model's context")
    source = d.get("source", "")
    if not isinstance(source, str) or len(source) > 4096 or "\0" in source:
        raise ValueError("bad image source")
    return d


def messages(meta: dict, model) -> list:
    """The file's messages as session.Message objects, every field checked. Raises ValueError
    (or KeyError / TypeError) for anything a session could not use safely."""
    from .session import Message

    raw = meta["messages"]
    if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
        raise ValueError("messages is not a list of a usable length")
    total = 0
    out = []
    for m in raw:
        if not isinstance(m, dict):
            raise ValueError("message is not an object")
        text = m.get("text")
        if not isinstance(text, str):
            raise ValueError("message text missing")
        total += len(text)
        if total > MAX_SAVED_TEXT_CHARS:
            raise ValueError("messages too long in total")
        images = m.get("images", [])
        if not isinstance(images, list) or len(images) > MAX_IMAGES_PER_MESSAGE:
            raise ValueError("bad image list")
        if images and m.get("role") != "user":
            raise ValueError("images in a non-user message")
        for im in images:
            image_json(im, model)
        out.append(Message.from_json(m))
    dropped = meta.get("dropped", [])
    if not isinstance(dropped, list) or not all(_is_int(i) and 0 <= i < len(out) for i in dropped):
        raise ValueError("bad dropped list")
    return out


# ---- the cache and the token history -------------------------------------------------------------


def check_state(model, meta: dict, budget: int) -> None:
    """The cache description and history metadata must match the model and fit `budget`."""
    desc = meta.get("cache")
    if not isinstance(desc, dict):
        raise FFE("it is damaged (no KV cache description)")
    t = model.config.text
    want = {
        "fmt": model.kv_fmt,
        "layers": t.num_hidden_layers,
        "kv_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
    }
    for key, value in want.items():
        got = desc.get(key)
        if got != value or (key != "fmt" and not _is_int(got)):
            raise FFE(
                f"its KV cache has {key} {str(got)[:40]!r}; this model uses {value} "
                "(the file does not belong to this model)"
            )
    n = _int(desc.get("length"), "the cached length", 0, MAX_POSITION)
    if n > budget:  # a file of a longer context: not damaged, too long for this one
        raise FFE(f"it holds {n} tokens, more than the context budget of {budget} tokens")
    _int(meta.get("rope_delta", 0), "the rope delta", -MAX_POSITION, MAX_POSITION)
    spans = meta.get("spans", [])
    if not isinstance(spans, list) or len(spans) > n:
        raise FFE("it is damaged (image spans)")
    prev = 0
    for s in spans:
        if not isinstance(s, list) or len(s) != 3 or not isinstance(s[2], str):
            raise FFE("it is damaged (image spans)")
        start = _int(s[0], "an image span start", prev, n)
        _int(s[1], "an image span end", start + 1, n)
        prev = s[1]
    images = meta.get("images", [])
    if not isinstance(images, list) or not all(
        isinstance(h, str) and _HASH.fullmatch(h) for h in images
    ):
        raise FFE("it is damaged (image list)")


def check_history(tokens: np.ndarray, positions: np.ndarray) -> None:
    """Token ids and positions as read: integer arrays, positions within range (the vocabulary
    bound is checked by the session against the model)."""
    if not np.issubdtype(tokens.dtype, np.integer) or not np.issubdtype(
        positions.dtype, np.integer
    ):
        raise FFE("it is damaged (token ids or positions are not integers)")
    if positions.size and (positions.min() < 0 or positions.max() > MAX_POSITION):
        raise FFE("it is damaged (positions out of range)")


def check_embeddings(model, meta: dict, spans, embeddings: dict) -> None:
    """Every image span, and every message image, must have an embedding of exactly its rows
    (they replace those rows), with the model's DeepStack depth."""
    for m in meta.get("messages", []):
        for im in m.get("images", []):
            emb = embeddings.get(im["hash"])
            t, gh, gw = im["grid_thw"]
            rows = t * gh * gw // (im["merge_size"] ** 2)
            if emb is not None and emb.embeds.shape[0] != rows:
                raise FFE(f"it is damaged (image embedding {im['hash'][:12]} has the wrong size)")
    vision = model.config.vision
    levels = len(vision.deepstack_visual_indexes) if vision is not None else 0
    for span in spans:
        start, end, h = span[0], span[1], span[2]
        emb = embeddings.get(h)
        if emb is None:
            continue  # recomputed from the image on the next turn
        if emb.embeds.shape[0] != end - start or emb.deepstack.shape[0] != levels:
            raise FFE(f"it is damaged (image embedding {h[:12]} does not fit its rows)")
    for emb in embeddings.values():
        if not (np.isfinite(emb.embeds).all() and np.isfinite(emb.deepstack).all()):
            raise FFE("it is damaged (an image embedding holds NaN or infinite values)")


# ---- writing -------------------------------------------------------------------------------------


def check_target(path: Path | str) -> None:
    """InputError unless `path` may be replaced by a session file: absent, or a regular file
    that is a Merlin session of a format this Merlin reads. A text file, a bare KV file, a
    damaged file or a session written by a newer Merlin is never overwritten."""
    from .session import SESSION_FORMAT, SESSION_KIND

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"--session {path}: cannot be used ({e.strerror or e}).") from None
    if not stat.S_ISREG(st.st_mode):
        from .safe_open import kind_of

        raise InputError(
            f"--session {path} is {kind_of(st.st_mode)}, not a session file. Give the path of a "
            "session file, or of a file that does not exist yet."
        )
    advice = "it was not changed. Give another path (a new file) for this conversation's session."
    try:
        with arrayfile.Reader(path, SESSION_KIND) as r:
            identity = r.meta.get("identity")
            version = identity.get("format") if isinstance(identity, dict) else None
    except FFE as e:
        raise InputError(f"--session {path} is not a Merlin session file ({e}); {advice}") from None
    if not _is_int(version) or version > SESSION_FORMAT:
        raise InputError(
            f"--session {path} was written by another Merlin version (session format "
            f"{str(version)[:20]}, this one reads {SESSION_FORMAT}); {advice}"
        )
