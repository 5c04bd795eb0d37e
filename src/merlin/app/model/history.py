"""The stored conversation as the engine's turns, without images that can no longer be used.

A chat keeps references to images stored under the data folder. If one of an older message
is gone (deleted by hand, a restored backup without images/) or is of a kind the engine does
not decode (an SVG attached by an older Merlin), sending it would make every later question
of that chat fail. It is left out of what the model sees instead (the chat still shows the
message), and the caller tells the user which (prompt_turns: cheap checks, on the GUI
thread). One the engine refuses though it is there (truncated, damaged, a 1000x4 strip:
attached by a Merlin that did not check pictures yet) is found by decoding it, so the worker
thread leaves those out (without_refused_images: engine.vision.preprocess.check_image_file,
its verdict kept per file, size and time). The images of the last user message are kept as
they are, so a problem with the question just asked is reported as usual. Qt-free.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from merlin.app.model.prompting import Turn
from merlin.engine.errors import InputError
from merlin.engine.safe_open import is_regular
from merlin.engine.vision.budget import BudgetedImage
from merlin.engine.vision.preprocess import check_image_file

# file extensions of what engine.vision.image_file.IMAGE_FORMATS decodes
ENGINE_SUFFIXES = {"png", "jpg", "jpeg", "jfif", "jpe", "webp", "gif", "bmp", "tif", "tiff"}


def usable(path: Path) -> bool:
    return path.suffix.lower().lstrip(".") in ENGINE_SUFFIXES and is_regular(path)


def without_refused_images(turns: list[Turn]) -> tuple[list[Turn], list[str]]:
    """(turns, paths left out): the images of messages before the last user message that the
    engine refuses (module docstring). Decodes each picture the first time: call it off the
    GUI thread."""
    last_user = max((i for i, t in enumerate(turns) if t.role == "user"), default=-1)
    out, refused = [], []
    for i, t in enumerate(turns):
        if i == last_user or not t.images:
            out.append(t)
            continue
        kept = []
        for image in t.images:
            path = str(getattr(image, "path", image))  # a BudgetedImage or a path
            if _accepted(path):
                kept.append(image)
            else:
                refused.append(path)
        out.append(replace(t, images=kept) if len(kept) != len(t.images) else t)
    return out, refused


def _accepted(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _engine_accepts(path, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=4096)
def _engine_accepts(path: str, size: int, mtime_ns: int) -> bool:
    """check_image_file's verdict, kept per (path, size, time): every turn and every count of
    the context meter ask about every picture of the chat, and the check decodes each."""
    try:
        check_image_file(path)
    except (InputError, OSError):
        return False
    return True


def prompt_turns(rows, image_path: Callable) -> tuple[list[Turn], list[str]]:
    """(turns, names of the images left out). rows: store MessageRows in order;
    image_path(ref) -> Path. An image goes to the engine as its path, with the budget it was
    sent with when it had one of its own (engine.vision.budget.BudgetedImage). Failed or
    empty answers are left out (never sent back)."""
    last_user = max((i for i, r in enumerate(rows) if r.role == "user"), default=-1)
    turns, dropped = [], []
    for i, r in enumerate(rows):
        if r.role == "assistant" and (r.state == "error" or not r.text.strip()):
            continue  # a failed answer is shown, never sent back to the model
        paths = []
        for ref in r.images:
            p = Path(image_path(ref))
            if i == last_user or usable(p):
                # its own budget; the nearest the model allows if it was another model's
                own = ref.tokens is not None
                paths.append(BudgetedImage(str(p), ref.tokens, strict=False) if own else str(p))
            else:
                dropped.append(ref.name or p.name)
        ids = r.stats.get("token_ids") if r.role == "assistant" else None
        ids_ok = isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids)
        ids = ids if ids_ok else None
        reasoning = getattr(r, "reasoning", None) if r.role == "assistant" else None
        turns.append(Turn(r.role, r.text, paths, ids, reasoning))
    return turns, dropped


def missing_images_notice(names: list[str], tr=lambda text: text) -> str:
    """The notice for left-out images (tr: the app's translation function)."""
    shown = ", ".join(sorted(set(names))[:5])
    return tr(
        "Some images of earlier messages can no longer be read ({names}); the model answers "
        "without them."
    ).format(names=shown)
