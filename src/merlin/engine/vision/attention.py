"""The vision encoder's attention: bidirectional, inside each image, all heads.

Two forms. `attention` (the f32 encoder, the reference) is described below. `attention_int8`
(the q8 encoder) quantizes q, k and v to int8 and runs the fused one-pass kernel of
engine/kernels/span_attention.py (integer score and value products, an online softmax, the
scores never written out), parallel over heads and query tiles on Numba's threads: 2.5x the
BLAS form at 4,096 patches (docs/vision.md).

f32 form:

One task per (head, image span): q k^T in chunks of query rows sized to keep the scores in
cache (ATTN_CHUNK_ELEMS floats a chunk), exp(s - row max) in one compiled pass per row
(kernels.attention.exp_minus_row_max: a vectorised exp, two passes over a row instead of
NumPy's three), then p [v, 1] whose last column is the softmax denominator, so the division
runs on HD columns instead of S. The tasks run on a
pool of `threads` Python threads with BLAS set to one thread meanwhile: every step of a head
(both products and the exp kernel, which release the GIL) runs on one core, the heads side
by side: a multi-threaded BLAS spends most of its time waiting on these small products
(64-wide inner or outer size). Figures: docs/vision.md ("Attention threaded by head").

Results do not depend on the thread count: each (head, span) is computed by the same calls
whatever thread runs it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels import span_attention as span
from ..kernels.attention import exp_minus_row_max

ATTN_CHUNK_ELEMS = 1 << 20  # score rows per chunk ~ this / keys: 4 MB of scores per thread

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_LOCK = threading.Lock()


def thread_pool(threads: int) -> ThreadPoolExecutor:
    """The vision encoder's pool of `threads` Python threads (made again when the count
    changes): the f32 attention's heads, the q8 encoder's row chunks of tanh-GELU."""
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE != threads:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL = ThreadPoolExecutor(threads, thread_name_prefix="merlin-vision")
            _POOL_SIZE = threads
        return _POOL


def _head(q, k, v, h: int, s0: int, s1: int, scale, out) -> None:
    """out[s0:s1, h*HD:(h+1)*HD] = softmax(q k^T * scale) v for one head and one span."""
    hd = q.shape[2]
    n = s1 - s0
    rows = int(min(n, max(16, ATTN_CHUNK_ELEMS // n)))
    buf = np.empty(rows * n, np.float32)
    o_aug = np.empty((rows, hd + 1), np.float32)
    v_aug = np.ones((n, hd + 1), np.float32)
    v_aug[:, :hd] = v[h, s0:s1]
    q_h = q[h, s0:s1] * scale
    k_t = k[h, s0:s1].T
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        sc = buf[: (r1 - r0) * n].reshape(r1 - r0, n)
        np.matmul(q_h[r0:r1], k_t, out=sc)
        exp_minus_row_max(sc)
        o = o_aug[: r1 - r0]
        np.matmul(sc, v_aug, out=o)
        np.divide(o[:, :hd], o[:, hd:], out=out[s0 + r0 : s0 + r1, h * hd : (h + 1) * hd])


def attention(q, k, v, spans, scale, out, threads: int) -> None:
    """q, k, v: [H, S, HD] f32; spans: [(start, end)] attention units; out: [S, H*HD]."""
    tasks = [(h, s0, s1) for s0, s1 in spans for h in range(q.shape[0])]
    if threads <= 1 or len(tasks) == 1:
        for h, s0, s1 in tasks:
            _head(q, k, v, h, s0, s1, scale, out)
        return
    from ..cpu import set_blas_threads

    pool = thread_pool(threads)
    set_blas_threads(1)
    try:
        futures = [pool.submit(_head, q, k, v, h, s0, s1, scale, out) for h, s0, s1 in tasks]
        for f in futures:
            f.result()
    finally:
        set_blas_threads(threads)


def attention_int8(q, k, v, spans, scale, out) -> None:
    """attention() with int8 products, one fused pass per span (kernels/span_attention.py):
    q, k, v: [H, S, HD] f32 C-contiguous; out: [S, H*HD]."""
    heads, _, hd = q.shape
    for s0, s1 in spans:
        n = s1 - s0
        packed = span.new_packed(heads, n, hd)
        span.pack_span(q, k, v, s0, n, np.float32(scale), *packed)
        span.span_attention(*packed, n, out, s0, hd)
