"""The image-token budget: how many vision tokens one picture may become, chosen by the user
within what the checkpoint and the context allow, with a default that fits the machine.

One image token covers factor x factor pixels (factor = patch_size x merge_size, 32 for
Qwen3-VL), so a budget of N tokens is a pixel budget of N x factor^2 for smart_resize; the
checkpoint's min_pixels stays the floor (a budget below min_pixels / factor^2 tokens is
refused with that number). The encoder's cost grows with the square of the tokens in its
attention (engine/vision/cost.py), so the budget decides the wait: the checkpoint's own
max_pixels (16,777,216 for Qwen3-VL: up to 16,384 tokens) makes a phone photo cost minutes.

Presets (the composer's per-image menu and Settings): fast 256 tokens, detailed 1024, full =
the checkpoint's max_pixels. The default comes from the machine class (machine_class()):

    board    aarch64 / arm (RK3588: 4 A76 cores)     256 tokens
    small    x86-64 with at most 2 CPUs in use        512 tokens
    desktop  x86-64 with more                        1024 tokens

measured on the 2B shapes (docs/vision.md: encode time per budget on the dev host, and the
board projection). `python -m merlin.engine.bench vision` prints the figures to re-check.

Budgets travel as whole numbers of tokens; check_budget() turns a bad one into an InputError
that names the nearest valid value (InvalidBudget.nearest), and check_image_fits() refuses a
picture whose tokens alone do not fit the context, before any encoding.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from ..errors import InputError
from .preprocess import PIXEL_LIMIT, PreprocessConfig, smart_resize

FAST_TOKENS = 256
DETAILED_TOKENS = 1024
PRESETS = ("fast", "detailed", "full")
CLASS_DEFAULTS = {"board": FAST_TOKENS, "small": 512, "desktop": DETAILED_TOKENS}


class InvalidBudget(InputError):
    """A budget outside what the checkpoint or the context allows; `nearest` is the closest
    budget that is allowed."""

    def __init__(self, message: str, nearest: int):
        super().__init__(message)
        self.nearest = int(nearest)


@dataclass(frozen=True)
class BudgetedImage:
    """An image file with its own token budget (the composer's per-image choice); a plain
    path gets the session's budget. strict=False: a budget kept from an earlier turn, maybe
    chosen under another model, becomes the nearest one this model allows instead of being
    refused (a chat whose old picture's budget the new model did not allow could not go on)."""

    path: str
    tokens: int | None = None
    strict: bool = True

    def __fspath__(self) -> str:
        return self.path


def machine_class(cpus: int | None = None, machine: str | None = None) -> str:
    """'board', 'small' or 'desktop' (see the module docstring). cpus: CPUs the kernels run
    on (default: this process's allowed CPUs)."""
    machine = (machine or platform.machine()).lower()
    if machine.startswith(("aarch64", "arm")):
        return "board"
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return "small" if cpus <= 2 else "desktop"


def default_tokens(pre: PreprocessConfig | None = None, cls: str | None = None) -> int:
    """The machine class's default budget, within the checkpoint's limits."""
    tokens = CLASS_DEFAULTS[cls or machine_class()]
    if pre is not None:
        tokens = max(min_tokens(pre), min(tokens, max_tokens(pre)))
    return tokens


def min_tokens(pre: PreprocessConfig) -> int:
    """The fewest tokens an image becomes: the checkpoint's min_pixels, in tokens (at least 1)."""
    return max(1, -(-pre.min_pixels // (pre.factor * pre.factor)))


def max_tokens(pre: PreprocessConfig) -> int:
    """The most tokens an image may become: the checkpoint's max_pixels, in tokens."""
    return max(1, min(pre.max_pixels, PIXEL_LIMIT) // (pre.factor * pre.factor))


def preset_tokens(name: str, pre: PreprocessConfig) -> int:
    """Tokens of a preset ('fast', 'detailed', 'full') for this checkpoint."""
    if name == "full":
        return max_tokens(pre)
    if name == "fast":
        t = FAST_TOKENS
    elif name == "detailed":
        t = DETAILED_TOKENS
    else:
        raise InputError(f"unknown image detail {name!r}; choose one of {', '.join(PRESETS)}.")
    return max(min_tokens(pre), min(t, max_tokens(pre)))


def preset_of(tokens: int, pre: PreprocessConfig) -> str | None:
    """The preset with exactly this many tokens, or None (a custom budget)."""
    for name in PRESETS:
        if preset_tokens(name, pre) == tokens:
            return name
    return None


def check_budget(tokens, pre: PreprocessConfig, context_tokens: int | None = None) -> int:
    """tokens as a valid budget, or InvalidBudget naming the nearest valid value: at least the
    checkpoint's minimum, at most its maximum and at most what the context holds."""
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise InvalidBudget(
            f"the image-token budget must be a whole number, got {tokens!r}.",
            default_tokens(pre),
        )
    lo, hi = min_tokens(pre), max_tokens(pre)
    by_context = context_tokens is not None and 0 < context_tokens < hi
    if by_context:
        hi = max(lo, int(context_tokens) - 1)
    if tokens < lo:
        raise InvalidBudget(
            f"an image-token budget of {tokens:,} is below this model's minimum: its "
            f"preprocessor_config.json asks for at least {pre.min_pixels:,} pixels, "
            f"{lo:,} tokens. Use {lo:,} or more.",
            lo,
        )
    if tokens > hi:
        why = (
            f"the context holds {context_tokens:,} tokens"
            if by_context
            else f"this model allows at most {hi:,} ({pre.max_pixels:,} pixels)"
        )
        raise InvalidBudget(
            f"an image-token budget of {tokens:,} is too large: {why}. Use {hi:,} or less.",
            hi,
        )
    return tokens


def preprocess_for(pre: PreprocessConfig, tokens: int | None) -> PreprocessConfig:
    """The preprocessing config for a budget of `tokens` (None: the checkpoint's own)."""
    if tokens is None:
        return pre
    tokens = check_budget(tokens, pre)
    return pre.with_max_pixels(tokens * pre.factor * pre.factor)


def max_pixels_for(pre: PreprocessConfig, tokens: int | None) -> int | None:
    """The pixel budget of a token budget (None: the checkpoint's own)."""
    if tokens is None:
        return None
    return check_budget(tokens, pre) * pre.factor * pre.factor


def tokens_for(width: int, height: int, pre: PreprocessConfig, tokens: int | None) -> int:
    """Vision tokens a width x height image becomes with this budget."""
    cfg = preprocess_for(pre, tokens)
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return (h // cfg.factor) * (w // cfg.factor)


def lower_preset(needed_room: int, pre: PreprocessConfig) -> str | None:
    """The largest preset whose budget is at most needed_room tokens, or None."""
    fitting = [n for n in PRESETS if preset_tokens(n, pre) <= needed_room]
    return max(fitting, key=lambda n: preset_tokens(n, pre)) if fitting else None


def check_image_fits(
    n_tokens: int, context_tokens: int, pre: PreprocessConfig, source: str = ""
) -> None:
    """Refuse (InvalidBudget) a picture whose tokens alone do not fit the context, before any
    encoding, with the numbers and the preset to choose instead."""
    if context_tokens <= 0 or n_tokens < context_tokens:
        return
    room = context_tokens - 1
    name = lower_preset(room, pre)
    what = f"{source}: this picture" if source else "this picture"
    if room < min_tokens(pre):  # no budget this model takes would fit: only the context can
        advice = f"the smallest picture this model takes is {min_tokens(pre):,} tokens"
    elif name:
        advice = f"choose '{name}' or lower"
    else:
        advice = f"use an image-token budget below {room:,}"
    raise InvalidBudget(
        f"{what} needs {n_tokens:,} tokens; the context holds {context_tokens:,}; {advice}, "
        "or raise the context budget.",
        max(min_tokens(pre), min(room, preset_tokens(name, pre) if name else room)),
    )


def resolve(
    pre: PreprocessConfig,
    image_tokens: int | None,
    session_tokens: int | None,
    session_max_pixels: int | None = None,
    context_tokens: int | None = None,
) -> tuple[int | None, str]:
    """(max_pixels for prepare_image, tag for the image hash) of one image: its own budget,
    else the session's, else the session's legacy pixel budget, else the machine's default
    (kept below context_tokens). A budget outside the checkpoint's limits is an InvalidBudget
    naming the nearest valid value; one above the context is allowed here ('full' for a small
    picture is fine): check_image_fits() judges the picture's own tokens."""
    tokens = image_tokens if image_tokens is not None else session_tokens
    if tokens is None and session_max_pixels:
        return session_max_pixels, f"px{session_max_pixels}"
    if tokens is None:  # the machine's default: within what this context holds, silently
        tokens = default_tokens(pre)
        if context_tokens:
            tokens = max(min_tokens(pre), min(tokens, int(context_tokens) - 1))
    tokens = check_budget(tokens, pre)  # the context is checked on the picture's own tokens
    return tokens * pre.factor * pre.factor, f"t{tokens}"
