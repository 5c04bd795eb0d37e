"""Decode, verify and prefill figures for one (weights, KV) format pair on one checkpoint.

Runs in its own process (see __main__), so peak RSS, load time and Numba compile time belong
to this format pair alone.
"""

from __future__ import annotations

import resource
import time

import numpy as np

from ..kernels.kv_layout import key_tiles
from ..model import load_model
from ..profile import StepTimer
from ..rope import text_positions
from .machine import median_time


def peak_rss_bytes() -> int:
    """This process's peak resident memory. Linux: VmHWM, the high-water mark of its own
    address space. getrusage's ru_maxrss is not: Linux carries it across execve, so a child
    started by the benchmark (vfork + exec) reported the parent's peak when that was higher
    (2.16 GB for q4/q8 weights/KV, whose own peak was 1.94 GB)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fill_cache(cache, n: int, rng) -> None:
    """Put n tokens of random K/V in the cache: decode cost does not depend on the values.
    One layer at a time, so the random temporaries do not add a second cache to peak RSS."""
    cache.reserve(n)
    for layer in range(cache.n_layers):
        k, v = cache.k[layer, :, : key_tiles(n)], cache.v[layer, :, :n]
        if cache.fmt == "f32":
            k[...] = rng.standard_normal(k.shape, dtype=np.float32)
            v[...] = rng.standard_normal(v.shape, dtype=np.float32)
        else:
            k[...] = rng.integers(-127, 128, k.shape, dtype=np.int8)
            v[...] = rng.integers(-127, 128, v.shape, dtype=np.int8)
    if cache.fmt == "q8":
        cache.k_scale[:, :, :n] = 0.01
        cache.v_scale[:, :, :n] = 0.01
    cache.length = n


def decode_at(model, cache, ctx: int, steps: int) -> dict:
    """Median of `steps` one-token forwards at context ctx (the cache is rolled back after
    each, so every step sees the same context)."""
    rows = []
    token = np.array([1])
    for _ in range(steps + 1):  # the first one warms caches and is dropped
        timer = StepTimer()
        model.text.forward(token, text_positions(ctx, 1), cache, timer=timer)
        total = time.perf_counter() - timer._t0
        cache.truncate(ctx)
        rows.append((timer.gemm, timer.attn, total))
    gemm, attn, total = np.median(np.array(rows[1:]), axis=0)
    weight_bytes = model.bytes_per_token
    kv_bytes = ctx * cache.bytes_per_token()
    return {
        "context": ctx,
        "ms_per_token": total * 1e3,
        "gemm_ms": gemm * 1e3,
        "attn_ms": attn * 1e3,
        "other_ms": (total - gemm - attn) * 1e3,
        "weight_bytes": weight_bytes,
        "kv_bytes": kv_bytes,
        "gemm_gbs": weight_bytes / gemm / 1e9,
        "attn_gbs": kv_bytes / attn / 1e9,
        "tokens_per_s": 1 / total,
    }


SPLIT_K = 4  # the verify whose gemm / attn / other split the benchmark reports


def verify_cost(model, cache, ctx: int, ks=range(1, 9), repeats: int = 9) -> dict:
    """V(K)/T: time of one forward over K+1 tokens relative to a one-token forward. Each
    V(K) is timed right after a T, in rounds over all K, and the ratio is the median of those
    adjacent pairs: the shared host's bandwidth drifts over seconds, which a T timed once
    before all the V(K) put into the ratios. Also where T's and V(SPLIT_K)'s time goes
    (medians, ms): what grows with the rows of a verify."""

    def timed(n):
        timer = StepTimer()
        model.text.forward(
            np.ones(n, np.int64), text_positions(ctx, n), cache, logits="all", timer=timer
        )
        elapsed = time.perf_counter() - timer._t0
        cache.truncate(ctx)
        return elapsed, (timer.gemm, timer.attn, elapsed - timer.gemm - timer.attn)

    for k in (0, *ks):
        timed(k + 1)  # warm-up: first calls of each shape
    singles, ratios = [], {k: [] for k in ks}
    splits = {"T": [], "V": []}
    for _ in range(repeats):
        for k in ks:
            t1, split1 = timed(1)
            tk, split_k = timed(k + 1)
            singles.append(t1)
            ratios[k].append(tk / t1)
            if k == SPLIT_K:
                splits["T"].append(split1)
                splits["V"].append(split_k)
    out = {
        "T_ms": float(np.median(singles)) * 1e3,
        **{f"V({k})/T": float(np.median(ratios[k])) for k in ks},
    }
    if splits["V"]:
        out[f"V({SPLIT_K})_split_ms"] = {
            which: dict(zip(("gemm", "attn", "other"), np.median(rows, axis=0) * 1e3))
            for which, rows in splits.items()
        }
    return out


PREFILL_TOKENS = 512


def prefill(model, cache, n: int = PREFILL_TOKENS) -> dict:
    """A prompt of n tokens into the (emptied) cache the decode runs used, as the app
    prefills into its one cache of the whole context budget (a second cache would add its
    own bytes to the peak RSS)."""
    cfg = model.config.text
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, n)

    def f():
        cache.truncate(0)
        model.text.forward(ids, text_positions(0, n), cache)

    seconds = median_time(f, 2)
    head = model.text.w.lm_head
    per_row = sum(m.out_features * m.in_features for m in model.text.w.matrices())
    # every row goes through every layer matrix; the lm_head runs for the last row only
    matmul_flops = 2 * n * per_row - 2 * (n - 1) * head.out_features * head.in_features
    attn_flops = 4 * cfg.num_hidden_layers * cfg.q_size * n * (n + 1) / 2
    flops = matmul_flops + attn_flops
    return {
        "tokens": n,
        "seconds": seconds,
        "tokens_per_s": n / seconds,
        "gflops": flops / seconds / 1e9,
    }


def run(
    folder,
    weights: str,
    kv: str,
    contexts=(128, 2048),
    steps: int = 8,
    with_prefill: bool = True,
    with_verify: bool = True,
) -> dict:
    t0 = time.perf_counter()
    model = load_model(folder, weights=weights, kv=kv)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    # one cache for everything, big enough for the prefill's prompt too
    cache = model.new_cache(max(*contexts, PREFILL_TOKENS if with_prefill else 0) + 16)
    t0 = time.perf_counter()
    fill_cache(cache, 8, rng)
    model.text.forward(np.array([1]), text_positions(8, 1), cache)  # compiles (or loads) kernels
    model.text.forward(np.ones(3, np.int64), text_positions(9, 3), cache, logits="all")
    first_forward_s = time.perf_counter() - t0
    out = {
        "weights": weights,
        "kv": kv,
        "load_s": load_s,
        "first_forward_s": first_forward_s,
        "weight_bytes_per_token": model.bytes_per_token,
        "kv_bytes_per_token": cache.bytes_per_token(),
        "decode": [],
    }
    for ctx in contexts:
        fill_cache(cache, ctx, rng)
        out["decode"].append(decode_at(model, cache, ctx, steps))
    if with_verify:
        fill_cache(cache, contexts[0], rng)
        out["verify"] = verify_cost(model, cache, contexts[0])
    if with_prefill:
        out["prefill"] = prefill(model, cache)
    out["peak_rss_bytes"] = peak_rss_bytes()
    out["kv_bytes_at_max_context"] = cache.nbytes
    return out
