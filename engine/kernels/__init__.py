"""Numba kernels. They write into `out` arrays given to them and call nothing of ours.

Every kernel here keeps the summation order of one output row independent of how many rows
are computed at once and of the thread count (parallelism is over output rows or heads only),
so that a K+1-token forward gives bit-identical rows to K+1 one-token forwards.

The Numba on-disk cache goes to an app-owned folder, versioned by Merlin's version, unless
NUMBA_CACHE_DIR is set: upgrades never load stale kernels and read-only installs still cache.
"""

import os

# OpenMP threads that spin after a parallel kernel hold the cores that NumPy's BLAS (prefill)
# and the next kernel need; on a shared or busy machine that made decode matvecs up to 20x
# slower here. Sleeping at once costs a few microseconds of wake-up per kernel instead.
os.environ.setdefault("GOMP_SPINCOUNT", "0")

if "NUMBA_CACHE_DIR" not in os.environ:
    from platformdirs import user_cache_dir

    from ..version import __version__

    os.environ["NUMBA_CACHE_DIR"] = os.path.join(user_cache_dir("merlin"), "numba", __version__)

# Reassociation lets LLVM vectorise reductions; no-NaN/no-Inf flags are left out so that an
# overflow shows as inf/nan instead of silently wrong numbers.
FASTMATH = {"reassoc", "contract", "nsz", "arcp", "afn"}
