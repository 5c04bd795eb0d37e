"""Bounds for every number Merlin reads from outside: one validation helper per kind of number.

A number from the command line, an environment variable, settings.ini, a checkpoint's JSON or
a saved file's header can size an allocation, drive a loop or index an array. Each kind of
number has one helper here with one bound, reused by every reader, so `--max-context`,
`context_budget` in settings.ini and a session header's budget are checked the same way.

Every helper takes the value as found (int, str, float from JSON...), a `name` for the
message ("--max-context", "threads in /home/me/.config/merlin/settings.ini") and returns a
plain int (or float); anything else raises `error` (InputError by default) with a message that
names the value, the source and the allowed range. Booleans, NaN, infinities, fractions and
digit strings longer than 30 characters are refused before any arithmetic.
"""

from __future__ import annotations

import math

from .errors import InputError

# ---- the bounds ---------------------------------------------------------------------------------

MAX_CONTEXT_TOKENS = 1 << 22  # 4,194,304: 16x Qwen3-VL's 262,144 positions
MAX_NEW_TOKENS = 1 << 22
MAX_THREADS = 1024
MAX_CPU_INDEX = 8191  # Linux's largest NR_CPUS
MAX_CPU_LIST_CHARS = 4096
MAX_SEED = 2**63 - 1  # numpy's default_rng takes non-negative integers; SQLite ints are 64-bit
MAX_ROW_ID = 2**63 - 1  # SQLite INTEGER PRIMARY KEY
MAX_IMAGE_PIXELS = 1 << 28  # a pixel budget; preprocessor_config.json caps at 16,777,216
MAX_BYTES = 1 << 50  # a size in bytes (caches, caps): 1 PiB
MAX_COUNT = 1 << 31  # a count of anything sizing a Python loop
_MAX_DIGITS = 30


def integer(
    value,
    name: str,
    lo: int,
    hi: int,
    error: type[Exception] = InputError,
    *,
    strict: bool = False,
) -> int:
    """`value` as an int in [lo, hi]; `error` naming `name` and the range otherwise. strict
    (values from files): only an int is accepted, not "5" or 5.0."""

    def bad(got) -> Exception:
        return error(f"{name} must be a whole number from {lo:,} to {hi:,}, got {got}.")

    if isinstance(value, bool) or value is None:
        raise bad(repr(value))
    if strict and not isinstance(value, int):
        raise bad(repr(value)[:40])
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if len(text) > _MAX_DIGITS or not text.lstrip("+-").isdigit():
            raise bad(repr(value[:40]))
        n = int(text)
    elif isinstance(value, int):
        n = value
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise bad(repr(value))
        n = int(value)
    else:
        try:
            import numpy as np

            if isinstance(value, np.integer):
                n = int(value)
            elif isinstance(value, np.floating) and math.isfinite(value) and value == int(value):
                n = int(value)
            else:
                raise bad(type(value).__name__)
        except ImportError:  # pragma: no cover
            raise bad(type(value).__name__) from None
    if not lo <= n <= hi:
        raise bad(f"{n:,}" if abs(n) < 10**_MAX_DIGITS else "a number too large to use")
    return n


def number(value, name: str, lo: float, hi: float, error: type[Exception] = InputError) -> float:
    """`value` as a finite float in [lo, hi]."""
    if isinstance(value, bool) or value is None:
        raise error(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}.")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise error(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}.") from None
    if not math.isfinite(x) or not lo <= x <= hi:
        raise error(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}.")
    return x


# ---- one helper per kind -----------------------------------------------------------------------


def context_tokens(value, name: str, *, allow_zero: bool = True, error=InputError) -> int:
    """A context budget or length in tokens (0: the model's maximum, when allowed)."""
    return integer(value, name, 0 if allow_zero else 1, MAX_CONTEXT_TOKENS, error)


def new_tokens(value, name: str = "--max-new-tokens", error=InputError) -> int:
    return integer(value, name, 1, MAX_NEW_TOKENS, error)


def threads(value, name: str = "--threads", *, allow_zero: bool = True, error=InputError) -> int:
    """A kernel thread count (0: one per CPU used, when allowed)."""
    return integer(value, name, 0 if allow_zero else 1, MAX_THREADS, error)


def seed(value, name: str = "--seed", error=InputError) -> int:
    return integer(value, name, 0, MAX_SEED, error)


def row_id(value, name: str, error=InputError) -> int:
    """An SQLite row id (a chat id in settings.ini)."""
    return integer(value, name, 0, MAX_ROW_ID, error)


def pixels(value, name: str = "--max-pixels", error=InputError) -> int:
    return integer(value, name, 1, MAX_IMAGE_PIXELS, error)


def byte_size(value, name: str, lo: int = 0, hi: int = MAX_BYTES, error=InputError) -> int:
    return integer(value, name, lo, hi, error)


def count(value, name: str, hi: int = MAX_COUNT, lo: int = 0, error=InputError) -> int:
    """A count or index read from a file (layers, heads, lengths, offsets): an int only."""
    return integer(value, name, lo, hi, error, strict=True)


def token_id(value, vocab_size: int, name: str = "token id", error=InputError) -> int:
    return integer(value, name, 0, max(0, vocab_size - 1), error)


def cpu_list(text, name: str = "--cpus", error=InputError) -> tuple[int, ...]:
    """'0-3,6' -> (0, 1, 2, 3, 6), each CPU at most MAX_CPU_INDEX, built without ever
    materialising a range larger than that (so '0-99999999999' is refused, not 4.6 GB)."""
    if not isinstance(text, str):
        raise error(f"{name}: a CPU list must be text like 0-3,6, got {type(text).__name__}.")
    if len(text) > MAX_CPU_LIST_CHARS:
        raise error(f"{name}: the CPU list is {len(text):,} characters long; give CPUs like 0-3,6.")
    text = text.strip()
    if not text:
        raise error(f"{name}: an empty CPU list; give CPUs like 0-3,6.")
    cpus: set[int] = set()

    def one(s: str) -> int:
        s = s.strip()
        if not s.isdigit() or len(s) > _MAX_DIGITS:
            raise error(
                f"{name}: {text[:80]!r} is not a CPU list; use all, big, or CPUs like 0-3,6."
            )
        n = int(s)
        if n > MAX_CPU_INDEX:
            raise error(
                f"{name}: CPU {n if n < 10**12 else 'number'} is out of range (CPUs are numbered "
                f"0 to at most {MAX_CPU_INDEX}); give CPUs like 0-3,6."
            )
        return n

    for part in text.split(","):
        if "-" in part:
            a_text, b_text = part.split("-", 1)
            a, b = one(a_text), one(b_text)
            if a > b:
                raise error(f"{name}: {part.strip()!r} is an empty range; write it low-high.")
            cpus.update(range(a, b + 1))
        else:
            cpus.add(one(part))
    return tuple(sorted(cpus))
