"""The stored conversation as the engine's turns, without images that can no longer be used.

A chat keeps references to images stored under the data folder. If one of an older message
is gone (deleted by hand, a restored backup without images/), is of a kind the engine does
not decode (an SVG attached by an older Merlin) or is one the engine refuses (truncated,
damaged, a 1000x4 strip: attached by a Merlin that did not check them yet; engine.vision.
preprocess.check_image_file, whose verdict is kept per file, size and time), sending it would
make every later question of that chat fail. It is left out of what the model sees instead
(the chat still shows the message), and the caller tells the user which. The images of the
last user message are kept as they are, so a problem with the question just asked is
reported as usual. Qt-free.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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
    """Whether the engine can take the image at path (module docstring)."""
    if path.suffix.lower().lstrip(".") not in ENGINE_SUFFIXES or not is_regular(path):
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _engine_accepts(str(path), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=4096)
def _engine_accepts(path: str, size: int, mtime_ns: int) -> bool:
    """check_image_file's verdict, kept per (path, size, time): every turn and the context
    meter ask about every picture of the chat, and the check decodes each."""
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
        ids = ids if isinstance(ids, list) and all(isinstance(t, int) for t in ids) else None
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
