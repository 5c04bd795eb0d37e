"""python -m merlin.engine.bench [SECTION ...] [options]: every benchmark of the engine.

Sections (default: decode prefill):
  decode, prefill  the engine end to end on the 2B shapes, each (weights, KV) pair in its own
                   process (load time, compile time and peak RSS its own), with the machine's
                   read bandwidth and sgemm measured in the same run (this module, decode.py)
  kernels          roofline figures of the weight kernels alone (kernels.py)
  vision           the vision encoder (vision.py)
  spec             speculative decoding (spec.py)
  session          how fast a follow-up question starts (session.py)
  board            cycle model of the decode step on CPUs that are not here: the RK3588's
                   Cortex-A76 / A55, the Cortex-A72; checked against this host (board.py)
  peer             llama.cpp side by side on the same checkpoint (peer.py)
  serve            the OpenAI-compatible server against the same request in-process (serve.py)
  moe              a mixture-of-experts checkpoint with the real widths, then llama.cpp on
                   the same checkpoint (moe.py; --no-peer: Merlin alone)
  demo-quality     the shipped demo model's answers, per weights format (demo_quality.py;
                   its own options: python -m merlin.engine.bench demo-quality --help)

The 2B-shaped random-weight checkpoint is built once in the real format and cached.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import MerlinError
from ..formats import WEIGHT_FORMATS
from ..kv_cache import KV_FORMATS
from . import board as board_section
from . import kernels as kernels_section
from . import peer as peer_section
from . import vision as vision_section
from .decode import SPLIT_K
from .sections import SectionUnavailable, choice_list, positive_int

SECTIONS = (
    "decode", "prefill", "kernels", "vision", "spec", "session", "board", "peer", "serve", "moe",
    "demo-quality",
)  # fmt: skip


def _one(args) -> None:
    """Child process: one format pair, result as JSON on stdout."""
    from . import decode

    result = decode.run(
        args.model,
        args.weights,
        args.kv,
        contexts=tuple(args.contexts),
        with_prefill="prefill" in args.what,
    )
    print(json.dumps(result))


def run_child(model: Path, weights: str, kv: str, what, contexts, env=None) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "merlin.engine.bench",
        *what,
        "--child",
        "--model",
        str(model),
        "--weights",
        weights,
        "--kv",
        kv,
        "--contexts",
        *map(str, contexts),
    ]
    import numba

    # the child runs with this process's thread count, set by --threads through set_threads
    env = dict(os.environ if env is None else env, NUMBA_NUM_THREADS=str(numba.get_num_threads()))
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"benchmark child failed ({weights}/{kv}):\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def compile_times(model: Path, weights: str, kv: str) -> dict:
    """Numba compile: the first forwards in a process with an empty kernel cache (cold) and
    with the warmed cache (warm)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=tmp)
        cold = run_child(model, weights, kv, ["decode"], [16], env=env)["first_forward_s"]
        warm = run_child(model, weights, kv, ["decode"], [16], env=env)["first_forward_s"]
    return {"cold_s": cold, "warm_s": warm}


def load_times(model: Path, weights: str) -> dict:
    """Loading in a fresh process: first with an empty quantized-weight cache (reads the
    checkpoint's bf16, quantizes, stores the cache), then from that cache. The first child's
    peak RSS shows whether quantizing streams (it should stay near the loaded size)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MERLIN_WEIGHT_CACHE=tmp)
        first = run_child(model, weights, "q8", ["decode"], [16], env=env)
        cached = run_child(model, weights, "q8", ["decode"], [16], env=env)
    return {
        "first_s": first["load_s"],
        "cached_s": cached["load_s"],
        "first_peak_rss_bytes": first["peak_rss_bytes"],
        "cached_peak_rss_bytes": cached["peak_rss_bytes"],
    }


def print_table(report: dict) -> None:
    m = report["machine"]
    bw = m["bandwidth_gbs"]
    print(
        f"machine: read bandwidth {bw:.1f} GB/s (best of before {m['before']['best_gbs']:.1f}"
        f" / after {m['after']['best_gbs']:.1f}), sgemm {m['sgemm_gflops']:.0f} GFLOP/s, "
        f"{report['threads']} threads"
    )
    print()
    print(
        f"{'weights':>7} {'kv':>4} {'ctx':>5} {'ms/tok':>8} {'gemm':>7} {'attn':>6} {'other':>6}"
        f" {'W MB/tok':>9} {'gemm GB/s':>9} {'%bw':>5} {'attn GB/s':>9} {'%bw':>5} {'tok/s':>6}"
    )
    for r in report["runs"]:
        for d in r["decode"]:
            print(
                f"{r['weights']:>7} {r['kv']:>4} {d['context']:>5} {d['ms_per_token']:8.1f} "
                f"{d['gemm_ms']:7.1f} {d['attn_ms']:6.1f} {d['other_ms']:6.1f} "
                f"{d['weight_bytes'] / 1e6:9.0f} {d['gemm_gbs']:9.1f} "
                f"{100 * d['gemm_gbs'] / bw:4.0f}% {d['attn_gbs']:9.1f} "
                f"{100 * d['attn_gbs'] / bw:4.0f}% {d['tokens_per_s']:6.1f}"
            )
    print()
    for r in report["runs"]:
        line = (
            f"{r['weights']:>7} {r['kv']:>4}: load {r['load_s']:.1f} s, "
            f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB"
        )
        if "verify" in r:
            v = r["verify"]
            line += "  V(K)/T " + " ".join(f"{v[f'V({k})/T']:.2f}" for k in range(1, 9))
            split = v.get(f"V({SPLIT_K})_split_ms")
            if split:
                t, vk = split["T"], split["V"]
                line += f"  V({SPLIT_K}) vs T ms: " + ", ".join(
                    f"{part} {vk[part]:.1f}/{t[part]:.1f}" for part in ("gemm", "attn", "other")
                )
        if "prefill" in r:
            p = r["prefill"]
            line += (
                f"  prefill {p['tokens']}: {p['tokens_per_s']:.0f} tok/s, "
                f"{p['gflops']:.0f} GFLOP/s = {100 * p['gflops'] / m['sgemm_gflops']:.0f}% "
                "of sgemm"
            )
        print(line)
    for w, t in report.get("load", {}).items():
        print(
            f"load {w} weights: first {t['first_s']:.1f} s (quantized from the bf16 checkpoint, "
            f"peak RSS {t['first_peak_rss_bytes'] / 1e9:.2f} GB), cached {t['cached_s']:.1f} s "
            f"(peak RSS {t['cached_peak_rss_bytes'] / 1e9:.2f} GB)"
        )
    for key, c in report.get("compile", {}).items():
        print(f"numba compile ({key}): cold {c['cold_s']:.1f} s, warm {c['warm_s']:.2f} s")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo-quality"]:  # its own section and flags (bench/demo_quality.py)
        from . import demo_quality

        return demo_quality.main(argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m merlin.engine.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", nargs="*", default=[], help=" ".join(SECTIONS))
    p.add_argument("--weights", type=choice_list(*WEIGHT_FORMATS), default=",".join(WEIGHT_FORMATS))
    p.add_argument("--kv", type=choice_list(*KV_FORMATS), default=",".join(KV_FORMATS))
    p.add_argument("--contexts", type=positive_int, nargs="+", default=[128, 2048])
    p.add_argument("--model", default=None, help="checkpoint (default: random 2B-shaped)")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument(
        "--no-compile", action="store_true", help="skip the cold-compile and first-load runs"
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help="kernels (7), vision (3), peer and moe's llama.cpp rounds (3)",
    )
    p.add_argument(
        "--moe-layers", type=positive_int, default=4, help="layers of the moe checkpoint"
    )
    p.add_argument("--no-peer", action="store_true", help="moe: without llama.cpp side by side")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    kernels_section.add_arguments(p)
    vision_section.add_arguments(p)
    board_section.add_arguments(p)
    peer_section.add_arguments(p)
    args = p.parse_args(argv)
    what = args.what or ["decode", "prefill"]
    unknown = [w for w in what if w not in SECTIONS]
    if unknown:
        p.error(f"unknown section {', '.join(unknown)}; choose from {' '.join(SECTIONS)}")
    args.what = what
    if args.json and (Path(args.json).is_dir() or not Path(args.json).parent.is_dir()):
        p.error(f"--json {args.json}: give a file in a folder that exists (checked before the run)")
    try:
        return _run(args)
    except MerlinError as e:  # a bad --model, a thread count this machine cannot run...
        print(f"bench: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    what = args.what
    # NUMBA_NUM_THREADS is not set here: Numba is imported already, and a value changed after
    # its threads start fails the next compile; set_threads sets the count, children inherit it
    if args.child:
        _one(args)
        return 0
    from ..demo import QWEN3VL_2B, ensure_random_checkpoint
    from ..threads import set_threads
    from .machine import read_bandwidth, sgemm_gflops

    threads = set_threads(args.threads)
    report: dict = {"threads": threads}
    for name, module in (
        ("kernels", kernels_section),
        ("vision", vision_section),
        ("board", board_section),
        ("peer", peer_section),
    ):
        if name in what:
            try:
                report[name] = module.section(args)
            except SectionUnavailable as e:
                print(f"{name}: {e}", file=sys.stderr)
                return 2
            what = [w for w in what if w != name]
            if name == "vision":  # f32 vs q8, time to first token (vision_ttft.py)
                from .vision_ttft import section as vision_ttft

                report["vision_ttft"] = vision_ttft(progress=lambda m: print(m, file=sys.stderr))
    if "spec" in what:
        from ..demo import QWEN3VL_2B as _2b
        from ..demo import ensure_random_checkpoint as _ensure
        from . import spec as spec_bench

        folder = Path(args.model) if args.model else _ensure(_2b)
        formats = [w for w in args.weights.split(",") if w != "f32"] or ["q4"]
        report["spec"] = []
        for weights in formats:
            print(f"speculative decoding, {weights} weights...", file=sys.stderr)
            report["spec"].append(spec_bench.run(folder, weights))
        print(spec_bench.report(report["spec"]))
        what = [w for w in what if w != "spec"]
    if "moe" in what:
        from . import moe as moe_bench

        report["moe"] = moe_bench.main_section(args)
        what = [w for w in what if w != "moe"]
    if "serve" in what:
        from . import serve as serve_bench

        w = args.weights if "," not in args.weights else "q4"
        kv = args.kv if "," not in args.kv else "q8"
        model_dir = Path(args.model) if args.model else None
        report["serve"] = serve_bench.run(
            model_dir, w, kv, progress=lambda m: print(m, file=sys.stderr)
        )
        print(serve_bench.report(report["serve"]))
        what = [w for w in what if w != "serve"]
    if "session" in what:
        from . import session as session_bench

        # one format pair: the given one, else q4 weights / f32 KV (a 2B prefill in f32 is slow)
        w = args.weights if "," not in args.weights else "q4"
        kv = args.kv if "," not in args.kv else "f32"
        model_dir = Path(args.model) if args.model else None
        s = session_bench.run(model_dir, w, kv, progress=lambda m: print(m, file=sys.stderr))
        report["session"] = s
        report["reuse_speedup"] = s["reuse_speedup"]
        report["restore_speedup"] = s["restore_speedup"]
        print(session_bench.report(s))
        what = [w for w in what if w != "session"]
    if not what:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        return 0
    model = Path(args.model) if args.model else None
    if model is None:
        model = ensure_random_checkpoint(
            QWEN3VL_2B,
            on_build=lambda: print("building the 2B-shaped random checkpoint...", file=sys.stderr),
        )
    before = read_bandwidth()
    runs = []
    for weights in args.weights.split(","):
        for kv in args.kv.split(","):
            print(f"running {weights} weights / {kv} KV...", file=sys.stderr)
            runs.append(run_child(model, weights, kv, what, args.contexts))
    after = read_bandwidth()
    report |= {
        "model": str(model),
        "machine": {
            "before": before,
            "after": after,
            "sgemm_gflops": sgemm_gflops(),
            "bandwidth_gbs": max(before["best_gbs"], after["best_gbs"]),
        },
        "runs": runs,
    }
    if not args.no_compile:
        report["load"] = {w: load_times(model, w) for w in args.weights.split(",")}
        w0 = args.weights.split(",")[-1]
        report["compile"] = {f"{w0}/f32": compile_times(model, w0, "f32")}
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
