"""Shared pieces of the robustness suites: hypothesis settings, the "clean failure" check and
file mutations.

Runs are reproducible: every fuzz test uses derandomize=True (the examples are a function of
the test) and no example database. For a longer or exploratory run:

    MERLIN_FUZZ_SCALE=20 pytest tests/robustness       # 20x the examples
    MERLIN_FUZZ_RANDOM=1 pytest tests/robustness       # new random examples each run
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import json
import os
import time
import tracemalloc

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from merlin.engine.errors import MerlinError

SCALE = float(os.environ.get("MERLIN_FUZZ_SCALE", "1"))
RANDOM = os.environ.get("MERLIN_FUZZ_RANDOM", "") not in ("", "0")
# One example slower than this is reported as a hang (the loaders work on small files here;
# generous so that a loaded CI machine does not fail a case that takes 0.1 s when idle).
EXAMPLE_SECONDS = 20.0
# Whole-test watchdog: a real hang dumps every thread's stack and ends the run, so CI fails
# with a traceback instead of timing out silently.
WATCHDOG_SECONDS = 600


def fuzz(examples: int, **kw) -> settings:
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        derandomize=not RANDOM,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        **kw,
    )


@contextlib.contextmanager
def watchdog(seconds: float = WATCHDOG_SECONDS):
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class Outcome:
    """What one call did: its result or its MerlinError, the time and the peak allocation."""

    def __init__(self, result=None, error: MerlinError | None = None, seconds=0.0, peak=0):
        self.result, self.error, self.seconds, self.peak = result, error, seconds, peak

    @property
    def ok(self) -> bool:
        return self.error is None


def attempt(fn, *args, trace_memory: bool = False, **kwargs) -> Outcome:
    """Call fn; a MerlinError is an accepted outcome, any other exception propagates (and fails
    the test with hypothesis' minimal example). trace_memory: measure the peak of Python and
    NumPy allocations during the call (tracemalloc must be running)."""
    if trace_memory:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    result = error = None
    try:
        result = fn(*args, **kwargs)
    except MerlinError as e:
        error = e
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base if trace_memory else 0
    out = Outcome(result, error, seconds, peak)
    assert seconds < EXAMPLE_SECONDS, f"{fn.__name__} took {seconds:.1f} s (a hang?)"
    if error is not None:
        assert isinstance(error, MerlinError)
        message = str(error)
        assert message.strip(), f"{type(error).__name__} without a message"
        assert "Traceback" not in message
    return out


@contextlib.contextmanager
def traced():
    """tracemalloc is tracing inside. Started on first use and stopped when the test module
    ends (conftest.py), not per example: tracemalloc.stop() races with allocations made at that
    moment by threads without the GIL (NumPy's PyTraceMalloc_Track; CPython gh-128679, fixed
    in 3.12.9 and 3.13.2, not in 3.11), which segfaulted a 1,000-example fuzz test in CI once
    while earlier tests' idle worker threads were alive."""
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    yield


# ---- JSON mutation ------------------------------------------------------------------------------

JUNK_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    3,
    7,
    2**31,
    2**53 + 1,
    2**64,
    10**30,
    -(2**63),
    0.5,
    -0.0,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x",
    "silu",
    "0",
    "-1",
    "\u0000",
    "\ud800",
    [],
    [0],
    [1, 2, 3],
    [[1]],
    {},
    {"a": 1},
    {"content": "<|im_end|>"},
]


def json_values(depth: int = 2):
    """Any JSON-ish value, including the awkward ones (NaN, huge ints, lone surrogates)."""
    scalars = st.one_of(
        st.sampled_from(JUNK_VALUES).map(copy.deepcopy),  # never share (and edit) the originals
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
    )
    if depth <= 0:
        return scalars
    return st.one_of(
        scalars,
        st.lists(json_values(depth - 1), max_size=4),
        st.dictionaries(st.text(max_size=8), json_values(depth - 1), max_size=4),
    )


def paths(obj, prefix=()):
    """Every path (tuple of keys/indexes) into a JSON value, the root excluded."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out += paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((*prefix, i))
            out += paths(v, (*prefix, i))
    return out


def _parent(obj, path):
    for key in path[:-1]:
        obj = obj[key]
    return obj


def mutate_json(data, draw, n_max: int = 3, focus=None):
    """A deep copy of `data` with 1..n_max random edits: replace a value, delete a key or item,
    add a key, change an integer slightly or wildly. focus(path) -> bool restricts the paths."""
    data = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(1, n_max))):
        candidates = paths(data)
        if focus is not None:
            candidates = [p for p in candidates if focus(p)] or candidates
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent = _parent(data, path)
        key = path[-1]
        kind = draw(st.sampled_from(["replace", "delete", "nudge", "add", "retype"]))
        if kind == "delete":
            del parent[key]
        elif kind == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(json_values(1))
        elif kind == "nudge" and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] = parent[key] + draw(st.sampled_from([-1, 1, -2, 2, 32, 10**6, -(10**6)]))
        elif kind == "retype":
            v = parent[key]
            parent[key] = copy.deepcopy(
                draw(st.sampled_from([str(v), [v], {"v": v}, None, float(v) if _num(v) else 1.5]))
            )
        else:
            parent[key] = draw(json_values(2))
    return data


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300


def dumps(data) -> str:
    return json.dumps(data, allow_nan=True)


# ---- byte mutation ------------------------------------------------------------------------------


def mutate_bytes(data: bytes, draw, hot: int | None = None, n_max: int = 4) -> bytes:
    """1..n_max byte-level edits (flip, overwrite, delete, insert, truncate, duplicate a span),
    positions biased to the first `hot` bytes when given (a header)."""
    b = bytearray(data)
    for _ in range(draw(st.integers(1, n_max))):
        if not b:
            b += draw(st.binary(min_size=1, max_size=8))
            continue
        limit = len(b) - 1
        if hot and draw(st.booleans()):
            limit = min(limit, hot)
        pos = draw(st.integers(0, limit))
        kind = draw(
            st.sampled_from(["flip", "set", "delete", "insert", "truncate", "dup", "digit"])
        )
        if kind == "flip":
            b[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            b[pos] = draw(st.sampled_from([0, 0x22, 0x2C, 0x5B, 0x5D, 0x7B, 0x7D, 0x30, 0xFF]))
        elif kind == "delete":
            del b[pos : pos + draw(st.integers(1, 16))]
        elif kind == "insert":
            b[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "truncate":
            del b[pos:]
        elif kind == "dup":
            n = draw(st.integers(1, 64))
            b[pos:pos] = b[pos : pos + n]
        else:  # a digit becomes another digit or a long run of digits
            b[pos : pos + 1] = draw(st.sampled_from([b"9", b"0", b"99999999999", b"-1", b"1e9"]))
    return bytes(b)
