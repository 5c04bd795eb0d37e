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
qgroup (grouped q4/q8, decode to prefill), qlinear (row-major q8: aarch64, generic),
attention, linear (f32), norm, rope, activation, mathfn. docs/kernels.md holds the
measurements behind them.
"""

import os

# How long libgomp's worker threads spin after a parallel kernel before they sleep: long enough
# to cover the gaps between one decode step's ~140 kernels, short enough not to hold the cores
# BLAS and the next kernel need (libgomp's default held them; figures in docs/kernels.md).
# SET_ENVIRONMENT names what Merlin put into the environment itself, so that a benchmark can start
# another engine (llama.cpp, bench/peer.py) with the environment the user has, not Merlin's.
SET_ENVIRONMENT = {k for k in ("GOMP_SPINCOUNT",) if k not in os.environ}
os.environ.setdefault("GOMP_SPINCOUNT", "10000")


def _fuse_dpwssd() -> None:
    """NUMBA_CPU_FEATURES with LLVM's vpdpwssd kept whole on the VNNI classes
    (target.features_with_fused_dpwssd), set before the first kernel compiles."""
    import sys

    from llvmlite import binding as ll

    from .target import TARGET, features_with_fused_dpwssd, host_features

    features = features_with_fused_dpwssd(TARGET, os.environ, host_features, ll.llvm_version_info)
    if features is None:
        return
    if "NUMBA_CPU_FEATURES" not in os.environ:
        SET_ENVIRONMENT.add("NUMBA_CPU_FEATURES")
    os.environ["NUMBA_CPU_FEATURES"] = features
    config = sys.modules.get("numba.core.config")
    if config is not None:  # Numba was imported first: it reads the environment again
        config.reload_config()


_fuse_dpwssd()

if "NUMBA_CACHE_DIR" not in os.environ:
    from platformdirs import user_cache_dir

    from ..version import __version__
    from .target import TARGET

    SET_ENVIRONMENT.add("NUMBA_CACHE_DIR")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(
        user_cache_dir("merlin"), "numba", __version__, TARGET.name
    )

# Reassociation lets LLVM vectorise reductions; no-NaN/no-Inf flags are left out so that an
# overflow shows as inf/nan instead of silently wrong numbers.
FASTMATH = {"reassoc", "contract", "nsz", "arcp", "afn"}
