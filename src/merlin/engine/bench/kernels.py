"""`python -m merlin.engine.bench kernels`: roofline figures of the weight kernels alone.

    python -m merlin.engine.bench kernels [--threads 2] [--repeats 7] [--quick] [--in-cache]
                                          [--no-prefill] [--scale-dtypes] [--json PATH]

In one run, because the shared host's bandwidth moves by 2x from minute to minute:
  1. the machine's read bandwidth (bench/machine.read_bandwidth), measured before and after
     the decode runs;
  2. decode (N = 1) and verify (N = 2, 4, 5, 8) products on Qwen3-VL-2B shapes for f32, q8 and
     q4 weights: GB/s of weight bytes, fraction of the bandwidth, V(N)/T(1);
  3. prefill (N = 512) GFLOP/s against NumPy sgemm of the same shape;
  4. quantization speed (seconds per 100 M weights) and, with --scale-dtypes, bf16 vs f32
     block scales.

Weights are cycled through enough copies (>= 256 MB per configuration) that every call reads
them from DRAM, as in a real decode step; repeats are interleaved across configurations and
the median is reported. --in-cache times one 256 x 2048 weight instead (q8: 0.5 MB, in one
core's L2) called IN_CACHE_CALLS times per repeat: the kernels' compute speed (run it with
--threads 1), which is what bounds a verify.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from ..kernels.linear import matmul_f32
from ..kernels.qgroup import (
    matmul_q4g,
    matmul_q8g,
    pack_q4_groups,
    pack_q8_groups,
)
from ..kernels.qlinear import (
    matmul_q8,
    matmul_q8_prefill,
    prefill_tile_rows,
)
from ..quant import bf16_round_up, quantize_q4, quantize_q8
from .machine import median_time, read_bandwidth, read_sum

# (name, O, K): the decoder's fused linears and the tied lm_head of Qwen3-VL-2B
SHAPES = [
    ("qkv", 3072, 2048),
    ("o", 2048, 2048),
    ("gate_up", 12288, 2048),
    ("down", 2048, 6144),
    ("lm_head", 151936, 2048),
]
NS = (1, 2, 4, 5, 8)
FORMATS = ("f32", "q8", "q8g", "q4")
MIN_BYTES = 256e6  # per configuration: 8x the last-level cache here
IN_CACHE = ("in-cache", 256, 2048)
IN_CACHE_CALLS = 64


# --------------------------------------------------------------------------- weights


def _random_weights(fmt, o, k, rng, scale_dtype="bf16"):
    """A weight in the given format with random contents (timing does not depend on them)."""
    if fmt == "f32":
        return (rng.standard_normal((o, k), dtype=np.float32) * 0.02,)
    s = rng.uniform(1e-4, 1e-3, (o, k // 32)).astype(np.float32)
    s = bf16_round_up(s) if scale_dtype == "bf16" else s
    if fmt == "q8":
        return rng.integers(-127, 128, (o, k), dtype=np.int8), s
    # the grouped layouts (engine/kernels/qgroup.py) read bf16 scale bits only
    bits = s if s.dtype == np.uint16 else bf16_round_up(s)
    if fmt == "q8g":
        return pack_q8_groups(rng.integers(-127, 128, (o, k), dtype=np.int8), bits)
    return pack_q4_groups(rng.integers(0, 256, (o, k // 2), dtype=np.uint8), bits)


def _copies(fmt, o, k, rng, scale_dtype="bf16", in_cache=False):
    """Enough distinct copies of one random weight that cycling through them reads DRAM (or,
    in_cache, the same weight IN_CACHE_CALLS times)."""
    first = _random_weights(fmt, o, k, rng, scale_dtype)
    nbytes = sum(a.nbytes for a in first)
    if in_cache:
        return [first] * IN_CACHE_CALLS, nbytes
    n = max(1, int(np.ceil(MIN_BYTES / nbytes)))
    return [first] + [tuple(a.copy() for a in first) for _ in range(n - 1)], nbytes


def _small_n_fn(fmt):
    return {"f32": matmul_f32, "q8": matmul_q8, "q8g": matmul_q8g, "q4": matmul_q4g}[fmt]


def _prefill_call(fmt, x, w, out, scratch):
    """A no-argument call of the prefill product: BLAS sgemm for f32 weights, dequantized
    tiles through it for row-major q8, the grouped kernels themselves for q8g and q4."""
    if fmt == "f32":
        return lambda: np.matmul(x, w[0].T, out=out)
    if fmt == "q8":
        return lambda: matmul_q8_prefill(x, *w, out, scratch)
    return lambda: _small_n_fn(fmt)(x, *w, out)


# --------------------------------------------------------------------------- runs


def bench_decode(
    shapes, formats, ns, repeats, rng, scale_dtype="bf16", in_cache=False
) -> list[dict]:
    """Per shape, all formats and N interleaved in every repeat, and a read-bandwidth probe
    (Numba sum over MIN_BYTES) in the same repeat: `of_bandwidth` is the median of per-repeat
    ratios, so a co-tenant that halves the bandwidth for a while moves both alike."""
    probe = np.ones(int(MIN_BYTES) // 4, np.float32)
    read_sum(probe)
    rows = []
    for name, o, k in shapes:
        sets = {fmt: _copies(fmt, o, k, rng, scale_dtype, in_cache) for fmt in formats}
        xs = {n: rng.standard_normal((n, k), dtype=np.float32) for n in ns}
        outs = {n: np.empty((n, o), np.float32) for n in ns}
        times = {(fmt, n): [] for fmt in formats for n in ns}
        bw = []
        for fmt, (mats, _) in sets.items():  # compile / warm up
            for n in ns:
                _small_n_fn(fmt)(xs[n], *mats[0], outs[n])
        for _ in range(repeats):
            t0 = time.perf_counter()
            read_sum(probe)
            bw.append(probe.nbytes / (time.perf_counter() - t0) / 1e9)
            for fmt, (mats, _) in sets.items():
                fn = _small_n_fn(fmt)
                for n in ns:
                    t0 = time.perf_counter()
                    for m in mats:
                        fn(xs[n], *m, outs[n])
                    times[fmt, n].append((time.perf_counter() - t0) / len(mats))
        bw = np.array(bw)
        for fmt, (_, nbytes) in sets.items():
            t1 = float(np.median(times[fmt, ns[0]]))
            for n in ns:
                ts = np.array(times[fmt, n])
                rows.append(
                    {
                        "shape": name,
                        "O": o,
                        "K": k,
                        "fmt": fmt,
                        "scales": scale_dtype if fmt != "f32" else "-",
                        "N": n,
                        "ms": float(np.median(ts)) * 1e3,
                        "bytes": nbytes,
                        "GBps": nbytes / float(np.median(ts)) / 1e9,
                        "probe_GBps": float(np.median(bw)),
                        "of_bandwidth": float(np.median(nbytes / ts / 1e9 / bw)),
                        "V_over_T": float(np.median(ts)) / t1,
                    }
                )
        del sets
    return rows


def bench_prefill(shapes, formats, n, repeats, rng) -> list[dict]:
    rows = []
    for name, o, k in shapes:
        x = rng.standard_normal((n, k), dtype=np.float32)
        out = np.empty((n, o), np.float32)
        weights = {fmt: _random_weights(fmt, o, k, rng) for fmt in ("f32",) + tuple(formats)}
        scratch = np.empty(prefill_tile_rows(o, k) * k, np.float32)
        fns = {fmt: _prefill_call(fmt, x, w, out, scratch) for fmt, w in weights.items()}
        for fn in fns.values():
            fn()
        times = {fmt: [] for fmt in fns}
        for _ in range(repeats):
            for fmt, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[fmt].append(time.perf_counter() - t0)
        flops = 2.0 * n * o * k
        sgemm = flops / float(np.median(times["f32"])) / 1e9
        for fmt in fns:
            g = flops / float(np.median(times[fmt])) / 1e9
            rows.append({"shape": name, "fmt": fmt, "N": n, "GFLOPs": g, "of_sgemm": g / sgemm})
    return rows


def bench_quantize(rng, o=12288, k=2048) -> dict:
    w = rng.standard_normal((o, k), dtype=np.float32) * 0.02
    res = {}
    for name, fn in (("q8", quantize_q8), ("q4", quantize_q4)):
        med = median_time(lambda fn=fn: fn(w), 3)
        res[name] = {"s_per_100M": med / w.size * 1e8}
    return res


def run(
    threads=None, repeats=7, quick=False, scale_dtypes=False, prefill=True, in_cache=False
) -> dict:
    if threads:
        from ..threads import set_threads

        set_threads(threads)  # at most the CPUs this process may use
    rng = np.random.default_rng(0)
    shapes = SHAPES if not quick else [s for s in SHAPES if s[0] in ("gate_up", "down")]
    if in_cache:
        shapes, prefill = [IN_CACHE], False
    result = {"threads": numba.get_num_threads(), "repeats": repeats}
    result["bandwidth_before"] = read_bandwidth(1.0)
    result["decode"] = bench_decode(shapes, FORMATS, NS, repeats, rng, in_cache=in_cache)
    if scale_dtypes:
        result["decode_f32_scales"] = bench_decode(
            shapes, ("q8", "q4"), (1, 4), repeats, rng, scale_dtype="f32", in_cache=in_cache
        )
    result["bandwidth_after"] = read_bandwidth(1.0)
    bw = max(result["bandwidth_before"]["best_gbs"], result["bandwidth_after"]["best_gbs"])
    result["bandwidth_GBps"] = bw
    for key in ("decode", "decode_f32_scales"):
        for row in result.get(key, []):
            row["of_run_bandwidth"] = row["GBps"] / bw
    if prefill:
        pshapes = [s for s in shapes if s[0] != "lm_head"]
        result["prefill"] = bench_prefill(
            pshapes, ("q8", "q8g", "q4"), 512, max(3, repeats // 2), rng
        )
    result["quantize"] = bench_quantize(rng)
    return result


def format_report(r: dict) -> str:
    lines = []
    b0, b1 = r["bandwidth_before"], r["bandwidth_after"]
    lines.append(
        f"threads {r['threads']}, repeats {r['repeats']} (medians)\n"
        f"read bandwidth: before {b0['best_gbs']:.1f} GB/s"
        f" (numpy dot {b0['numpy_dot_gbs']:.1f}, numba sum {b0['numba_sum_gbs']:.1f}),"
        f" after {b1['best_gbs']:.1f} GB/s"
        f" -> reference {r['bandwidth_GBps']:.1f} GB/s"
    )
    for key, title in (("decode", "decode / verify"), ("decode_f32_scales", "f32 block scales")):
        if key not in r:
            continue
        lines.append(
            f"\n{title}: GB/s of weight bytes (fraction of the read bandwidth probed in the"
            " same repeats) and V(N)/T(1)"
        )
        lines.append(
            f"{'shape':<9}{'fmt':<5}{'MB':>7}  " + "".join(f"{'N=' + str(n):>22}" for n in NS)
        )
        groups = {}
        for row in r[key]:
            groups.setdefault((row["shape"], row["fmt"]), []).append(row)
        for (shape, fmt), rows in groups.items():
            cells = {row["N"]: row for row in rows}
            text = ""
            for n in NS:
                if n in cells:
                    c = cells[n]
                    text += f"{c['GBps']:7.1f} ({c['of_bandwidth']:4.0%}) {c['V_over_T']:5.2f}x"
                else:
                    text += " " * 22
            lines.append(f"{shape:<9}{fmt:<5}{rows[0]['bytes'] / 1e6:7.1f}  {text}")
    if "prefill" in r:
        lines.append("\nprefill N=512: GFLOP/s (fraction of sgemm of the same shape)")
        for row in r["prefill"]:
            lines.append(
                f"{row['shape']:<9}{row['fmt']:<5}{row['GFLOPs']:8.1f} ({row['of_sgemm']:4.0%})"
            )
    q = r["quantize"]
    lines.append(
        f"\nquantize: q8 {q['q8']['s_per_100M']:.2f} s, q4 {q['q4']['s_per_100M']:.2f} s"
        " per 100 M weights (NumPy, one thread)"
    )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This section's options (the bench entry point adds them to its own parser)."""
    p.add_argument("--quick", action="store_true", help="kernels: gate_up and down shapes only")
    p.add_argument(
        "--scale-dtypes", action="store_true", help="kernels: also time f32 block scales"
    )
    p.add_argument("--no-prefill", action="store_true", help="kernels: no prefill products")
    p.add_argument(
        "--in-cache", action="store_true", help="kernels: one 256 x 2048 weight, in cache"
    )


def section(args) -> dict:
    """Run with the parsed arguments, print the report, return the figures."""
    repeats = args.repeats if args.repeats is not None else 7
    r = run(args.threads, repeats, args.quick, args.scale_dtypes, not args.no_prefill,
            args.in_cache)  # fmt: skip
    print(format_report(r))
    return r
