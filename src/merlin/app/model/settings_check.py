"""Bounds for the numbers in settings.ini (engine.limits), so a hand-edited or damaged value
can neither stop the app nor size anything: an out-of-range value is replaced by the default
and reported once, naming the file and the key. Qt-free."""

from __future__ import annotations

import logging

from merlin.engine import limits
from merlin.engine.errors import InputError

log = logging.getLogger(__name__)

# field -> (lo, hi) for ints, floats
BOUNDS = {
    "temperature": (0.0, 100.0),
    "top_p": (1e-6, 1.0),
    "top_k": (0, limits.MAX_COUNT),
    "min_p": (0.0, 0.999999),
    "repetition_penalty": (1e-3, 100.0),
    "max_new_tokens": (1, limits.MAX_NEW_TOKENS),
    "context_budget": (0, limits.MAX_CONTEXT_TOKENS),
    "threads": (0, limits.MAX_THREADS),
    "spec_k": (1, 8),
    "thinking_budget": (0, limits.MAX_NEW_TOKENS),
    "image_max_pixels": (0, 16_777_216),
    "session_cap_mb": (0, 1 << 30),
    "last_conversation": (0, limits.MAX_ROW_ID),
    "serve_port": (1, 65535),
}


def bounded(name: str, value, default, source: str) -> tuple[object, str]:
    """(value or the default, a problem sentence or "")."""
    bounds = BOUNDS.get(name)
    if bounds is None or isinstance(default, bool):
        return value, ""
    lo, hi = bounds
    where = f"{name} in {source}"
    try:
        if isinstance(default, int):
            return limits.integer(value, where, lo, hi), ""
        return limits.number(value, where, lo, hi), ""
    except InputError as e:
        problem = f"{e} The default ({default}) is used instead."
        log.warning("%s", problem)
        return default, problem
