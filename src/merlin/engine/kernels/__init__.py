"""Numba kernels. They write into `out` arrays given to them and call nothing of ours.

Every kernel here keeps the summation order of one output row independent of how many rows
are computed at once and of the thread count (parallelism is over output rows or heads only),
so that a K+1-token forward gives bit-identical rows to K+1 one-token forwards.

The Numba on-disk cache goes to an app-owned folder, versioned by Merlin's version and named
by the CPU class (kernels/target.py), unless NUMBA_CACHE_DIR is set: upgrades never load stale
kernels, read-only installs still cache, and kernels built for one class (their shape
constants are globals, which Numba's cache key does not include) are never loaded for another.
With NUMBA_CACHE_DIR set and MERLIN_CPU_CLASS changed between runs, use one folder per class.

Modules: target (the CPU class), irtools (the LLVM IR pieces every kernel shares: stack
scratch, prefetch, scale decode, vector loads), dots (the integer dot instructions per class),
actquant (activation quantization), reference (naive NumPy twins for tests); the kernels:
qgroup (grouped q4/q8, decode to prefill), qlinear (row-major q8 fallback), attention, linear
(f32), norm, rope, activation, mathfn. docs/kernels.md holds the measurements behind them.
"""

import os

# How long libgomp's worker threads spin after a parallel kernel before they sleep. libgomp's
# own default (300000 pauses, milliseconds) held the cores that NumPy's BLAS (prefill) and the
# next kernel needed, up to 20x slower decode matvecs on a busy machine. Sleeping at once (0)
# made every kernel wake a sleeping thread: on the 2-vCPU dev VM an empty 2-thread kernel took
# 94-105 us instead of 2-3 us, and a decode step calls ~140 of them. 10000 pauses spin about
# 0.1-0.2 ms here, which covers the gaps between one step's kernels; decode q4/q8 in
# alternating runs: 74 -> 64 and 124 -> 90 ms/token at context 128, 135 -> 67 and 178 -> 101
# at 2048 (attention 18-24 -> 8-12 ms), prefill 40 -> 44-45 tok/s, the vision encoder the
# same (5.2-5.9 vs 5.1-5.3 s, its kernels are single-threaded).
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

if "NUMBA_CACHE_DIR" not in os.environ:
    from platformdirs import user_cache_dir

    from ..version import __version__
    from .target import TARGET

    os.environ["NUMBA_CACHE_DIR"] = os.path.join(
        user_cache_dir("merlin"), "numba", __version__, TARGET.name
    )

# Reassociation lets LLVM vectorise reductions; no-NaN/no-Inf flags are left out so that an
# overflow shows as inf/nan instead of silently wrong numbers.
FASTMATH = {"reassoc", "contract", "nsz", "arcp", "afn"}
