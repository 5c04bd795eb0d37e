"""`--weights auto` (the default): q4 or q8 for the text decoder, whichever this CPU class runs
faster per token, measured by the kernels themselves.

q4 reads 0.53x the bytes of q8, so it is faster wherever its kernel keeps up with memory; on a
CPU class whose q4 kernel is compute-bound below the read bandwidth (issue 20: a q4 dot
without VNNI ran at a fifth of it) q8 wins. The choice times both kernels, as the model
would build them (linear.quantized_linear), on random weights of one decoder-like matrix per
format (MEASURE_SHAPE: 33 MB in q8, more than the L2 or L3 of most desktops), for a decode
step (N = 1) and a verify of 4 drafts (N = 5), alternating the two formats, REPEATS times
each; a format's time is its fastest call (other processes only ever add time: on a shared,
busy machine the medians of two runs picked different formats, the minima did not). q8 is
chosen only if both its decode step and its verify are more than NOISE faster than q4's (on
a machine with a load of 20 on 2 cores, one of three rounds still had q8 ahead at N = 1 by
chance, never at both N); otherwise the smaller q4 weights win.

The result is cached in a JSON file beside the kernels' Numba cache (whose folder is per CPU
class, engine/kernels/__init__.py), keyed by the class, the CPU name, the thread count and the
kernel sources' stamps; the warm-up (engine/warmup.py) fills it, `merlin-cli info` shows it.
MERLIN_AUTO_WEIGHTS=q4|q8 skips the measurement (tests, scripted runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import InputError

AUTO = "auto"
CANDIDATES = ("q4", "q8")
ENV_FORCE = "MERLIN_AUTO_WEIGHTS"
MEASURE_SHAPE = (8192, 4096)  # (O, K): the 2B's gate_up is 12288 x 2048, down 2048 x 6144
REPEATS = 15
NOISE = 0.05  # relative difference below which two timings count as equal
CACHE_NAME = "auto-weights.json"


@dataclass(frozen=True)
class WeightsChoice:
    fmt: str  # "q4" or "q8"
    reason: str
    cpu_class: str
    ms: dict  # {"q4": {"1": ms, "5": ms}, "q8": {...}} (empty when forced)
    source: str  # "measured", "cached" or "forced"

    def describe(self) -> str:
        return f"{self.fmt} ({self.reason}; {self.source})"


def resolve(weights: str) -> str:
    """A concrete weights format: `auto` becomes this CPU's choice, others pass through."""
    return choose().fmt if weights == AUTO else weights


def _kernel_stamp() -> str:
    """Changes when a kernel source, the CPU class, the thread count or Numba changes."""
    import numba

    from .kernels.target import TARGET

    root = Path(__file__).resolve().parent / "kernels"
    h = hashlib.sha256(
        f"{TARGET.name}|{TARGET.cpu_name}|{numba.get_num_threads()}|{numba.__version__}".encode()
    )
    for path in sorted(root.glob("*.py")):
        st = path.stat()
        h.update(f"{path.name}|{st.st_mtime_ns}|{st.st_size}".encode())
    for name in ("linear.py", "quant.py"):
        st = (root.parent / name).stat()
        h.update(f"{name}|{st.st_mtime_ns}|{st.st_size}".encode())
    return h.hexdigest()[:20]


def cache_path() -> Path:
    from . import kernels  # noqa: F401  (sets NUMBA_CACHE_DIR)

    return Path(os.environ["NUMBA_CACHE_DIR"]) / CACHE_NAME


def _read_cache(key: str) -> WeightsChoice | None:
    try:
        table = json.loads(cache_path().read_text())
        entry = table.get(key) if isinstance(table, dict) else None
        if isinstance(entry, dict) and entry.get("fmt") in CANDIDATES:
            return WeightsChoice(**{**entry, "source": "cached"})
    except (OSError, ValueError, TypeError):  # unreadable or foreign: measured again
        pass
    return None


def _write_cache(key: str, choice: WeightsChoice) -> None:
    path = cache_path()
    try:
        try:
            table = json.loads(path.read_text())
            table = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            table = {}
        table[key] = asdict(choice)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache folder: measured again next time (a fraction of a second)


_CHOSEN: WeightsChoice | None = None


def choose(refresh: bool = False) -> WeightsChoice:
    """This CPU's decoder format (once per process; from the cache file when it has it)."""
    global _CHOSEN
    forced = (os.environ.get(ENV_FORCE) or "").strip().lower()
    from .kernels.target import TARGET

    if forced:
        if forced not in CANDIDATES:
            raise InputError(f"{ENV_FORCE} must be q4 or q8, not {forced!r}.")
        return WeightsChoice(forced, f"{ENV_FORCE}={forced}", TARGET.name, {}, "forced")
    if _CHOSEN is not None and not refresh:
        return _CHOSEN
    key = _kernel_stamp()
    choice = None if refresh else _read_cache(key)
    if choice is None:
        choice = measure()
        _write_cache(key, choice)
    _CHOSEN = choice
    return choice


def _random_linear(fmt: str, rng):
    """A decoder-like matrix in `fmt` with random bytes, in the container the model uses."""
    import numpy as np

    from .linear import quantized_linear
    from .quant import QTensor

    o, k = MEASURE_SHAPE
    scales = np.full((o, k // 32), 0x3C00, np.uint16)  # bf16 2^-7: products stay finite
    if fmt == "q4":
        qs = rng.integers(0, 256, (o, k // 2), dtype=np.uint8)
    else:
        qs = rng.integers(-127, 128, (o, k), dtype=np.int8)
    return quantized_linear(QTensor(fmt, qs, scales))


def decide(ms: dict) -> str:
    """q4 unless q8 is more than NOISE faster at both the decode step (N = 1) and the verify
    (N = 5): never the clearly slower one, near-ties to the smaller weights."""
    faster = all(ms["q8"][n] < (1 - NOISE) * ms["q4"][n] for n in ("1", "5"))
    return "q8" if faster else "q4"


def measure(repeats: int = REPEATS) -> WeightsChoice:
    """Time both formats' decode kernels here and pick the faster (see the module docstring)."""
    import numpy as np

    from .kernels.target import TARGET

    rng = np.random.default_rng(0)
    lins = {fmt: _random_linear(fmt, rng) for fmt in CANDIDATES}
    o, k = MEASURE_SHAPE
    xs = {n: rng.standard_normal((n, k), dtype=np.float32) for n in (1, 5)}
    outs = {n: np.empty((n, o), np.float32) for n in (1, 5)}
    times: dict = {fmt: {n: [] for n in xs} for fmt in CANDIDATES}
    for fmt in CANDIDATES:  # compile (or load from the disk cache) and warm the caches
        for n in xs:
            lins[fmt](xs[n], outs[n])
    for _ in range(repeats):
        for n in xs:
            for fmt in CANDIDATES:
                t0 = time.perf_counter()
                lins[fmt](xs[n], outs[n])
                times[fmt][n].append(time.perf_counter() - t0)
    ms = {f: {str(n): float(np.min(t)) * 1e3 for n, t in by.items()} for f, by in times.items()}
    q4, q8 = ms["q4"]["1"], ms["q8"]["1"]
    fmt = decide(ms)
    mb = {f: lins[f].nbytes / 1e6 for f in CANDIDATES}
    reason = (
        f"{TARGET.name} kernels, {o} x {k} matrix, fastest of {repeats}, decode step: "
        f"q4 {q4:.2f} ms "
        f"({mb['q4'] / q4:.1f} GB/s), q8 {q8:.2f} ms ({mb['q8'] / q8:.1f} GB/s); "
        f"verify of 4: q4 {ms['q4']['5']:.2f}, q8 {ms['q8']['5']:.2f} ms"
    )
    return WeightsChoice(fmt, reason, TARGET.name, ms, "measured")


def kernel_info(requested: str) -> dict:
    """What `merlin-cli info` shows about the kernels: the CPU class and, for `requested`
    weights, the format used and why."""
    from .kernels.target import TARGET

    info = {
        "cpu_class": TARGET.name,
        "cpu_class_description": TARGET.describe(),
        "cpu_recognised": TARGET.recognised,
        "weights_requested": requested,
    }
    if requested != AUTO:
        return info | {"weights": requested, "weights_reason": "as asked"}
    choice = choose()
    reason = f"auto: {choice.reason}; {choice.source}"
    return info | {"weights": choice.fmt, "weights_reason": reason, "weights_ms": choice.ms}
