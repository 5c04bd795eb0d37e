"""`python -m merlin.engine.bench moe`: the mixture-of-experts decoder at Qwen3-30B-A3B's real
widths with a reduced layer count (engine.moe.random: the 48-layer bf16 file does not fit
this machine's disk and memory at once; every layer is alike, so L layers are measured and
the figures projected to 48).

Per weights format, in one process after the machine's read bandwidth is measured:
  decode ms/token at each context (median of steps, the cache rolled back after each), the
  weight bytes a token reads (dense parts, each router, k experts a layer) and the fraction
  of the read bandwidth that is; V(K)/T (engine.bench.decode.verify_cost); prefill tokens/s;
  the routing overhead (router product, softmax/top-k and grouping by expert alone, all
  routed layers, one row); experts read per decode token; the projection to 48 layers
  (the lm_head timed alone; the rest is L equal layers) and to a board of a given read
  bandwidth at the fraction of bandwidth reached here.

Then llama.cpp side by side on the same checkpoint (peer.py's machinery; --no-peer skips it):
its build (the peer venv), a conversion check on a tiny random MoE checkpoint (greedy tokens
of llama.cpp on its f32 qwen3moe GGUF against Merlin f32/f32, peer.check_greedy), the
checkpoint written as a qwen3moe GGUF (gguf_export.py, f16) and quantized by llama.cpp to
Q8_0 / Q4_0 for the formats asked (q8, q4), then alternating rounds per format, each engine in
its own process with the same threads: decode ms/token at the same contexts and a 512-token
prefill, printed as llama.cpp's time over Merlin's. When llama.cpp cannot be built or its
side fails, Merlin's figures stand and the report says why the comparison is missing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..kernels.experts import _plan
from ..model import load_model
from ..moe.random import REAL_LAYERS, ensure_random_moe_checkpoint
from . import peer
from .decode import PREFILL_TOKENS, decode_at, fill_cache, peak_rss_bytes, verify_cost
from .machine import median_time, read_bandwidth
from .sections import SectionUnavailable

BOARD_GBS = 10.0  # assumed RK3588 read bandwidth from the A76 cores (LPDDR4x); --board-gbs


def routing_ms(model, repeats: int = 20) -> float:
    """ms one row spends in routing (router product, route, grouping) over all routed
    layers."""
    rng = np.random.default_rng(1)
    experts = model.text.w.experts()
    d = model.config.text.hidden_size
    x = rng.standard_normal((1, d)).astype(np.float32)

    def f():
        for ew in experts:
            _plan(x, ew.router, ew.experts_per_token, ew.normalize)

    f()
    return median_time(f, repeats) * 1e3


def head_ms(model, repeats: int = 20) -> float:
    head = model.text.w.lm_head
    x = np.random.default_rng(2).standard_normal((1, head.in_features)).astype(np.float32)
    out = np.empty((1, head.out_features), np.float32)
    head(x, out)
    return median_time(lambda: head(x, out), repeats) * 1e3


def prefill_rate(model, cache, n: int) -> float:
    ids = np.random.default_rng(0).integers(0, model.config.text.vocab_size, n)
    from ..rope import text_positions

    def f():
        cache.truncate(0)
        model.text.forward(ids, text_positions(0, n), cache)

    f()
    return n / median_time(f, 2)


def run_format(folder, weights: str, kv: str, contexts, steps: int) -> dict:
    t0 = time.perf_counter()
    model = load_model(folder, weights=weights, kv=kv)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    cache = model.new_cache(max(*contexts, PREFILL_TOKENS) + 16)
    from ..rope import text_positions

    fill_cache(cache, 8, rng)
    model.text.forward(np.array([1]), text_positions(8, 1), cache)  # compile / load kernels
    layers = model.config.text.num_hidden_layers
    w = model.text.w
    decode = []
    for ctx in contexts:
        fill_cache(cache, ctx, rng)
        d = decode_at(model, cache, ctx, steps)
        d["experts_read"] = model.text.experts_read
        decode.append(d)
    fill_cache(cache, contexts[0], rng)
    verify = verify_cost(model, cache, contexts[0], ks=(1, 2, 4, 8), repeats=5)
    route_ms = routing_ms(model)
    lm_ms = head_ms(model)
    prefill = prefill_rate(model, cache, PREFILL_TOKENS)
    # projection: the lm_head (+ the embedding row) once, the rest in L equal layers
    fixed_bytes = w.lm_head.nbytes + w.embed.nbytes // w.embed.out_features + w.norm.nbytes
    per_layer_bytes = (w.bytes_per_token - fixed_bytes) / layers
    bytes_48 = fixed_bytes + REAL_LAYERS * per_layer_bytes
    t128 = decode[0]["ms_per_token"]
    ms_48 = lm_ms + REAL_LAYERS * (t128 - lm_ms) / layers
    routed = w.experts()
    return {
        "weights": weights,
        "kv": kv,
        "layers": layers,
        "load_s": load_s,
        "weight_bytes_per_token": w.bytes_per_token,
        "expert_bytes": routed[0].expert_bytes,
        "experts_per_token_per_layer": routed[0].experts_per_token,
        "decode": decode,
        "verify": verify,
        "routing_ms_per_token": route_ms,
        "routing_fraction": route_ms / t128,
        "lm_head_ms": lm_ms,
        "prefill_tokens_per_s": prefill,
        "projection_48": {
            "bytes_per_token": bytes_48,
            "ms_per_token": ms_48,
            "tokens_per_s": 1e3 / ms_48,
        },
        "peak_rss_bytes": peak_rss_bytes(),
    }


def run(
    folder=None,
    formats=("q4",),
    kv: str = "q8",
    contexts=(128, 2048),
    steps: int = 8,
    layers: int = 4,
    board_gbs: float = BOARD_GBS,
    progress=None,
) -> dict:
    say = progress or (lambda m: None)
    if folder is None:
        folder = ensure_random_moe_checkpoint(
            layers, on_build=lambda: say(f"building the {layers}-layer 30B-A3B-shaped checkpoint")
        )
    before = read_bandwidth()
    runs = []
    for weights in formats:
        say(f"moe: {weights} weights / {kv} KV...")
        runs.append(run_format(folder, weights, kv, contexts, steps))
    after = read_bandwidth()
    bandwidth = max(before["best_gbs"], after["best_gbs"])
    for r in runs:
        for d in r["decode"]:  # against the better of the two bandwidth measurements
            gbs = (d["weight_bytes"] + d["kv_bytes"]) / (d["ms_per_token"] * 1e6)
            d["bandwidth_fraction"] = gbs / bandwidth
            d["gemm_bandwidth_fraction"] = d["gemm_gbs"] / bandwidth
        frac = r["decode"][0]["bandwidth_fraction"]
        p = r["projection_48"]
        r["board"] = {
            "read_gbs": board_gbs,
            "bound_tokens_per_s": board_gbs * 1e9 / p["bytes_per_token"],
            "at_this_fraction_tokens_per_s": frac * board_gbs * 1e9 / p["bytes_per_token"],
        }
    return {
        "model": str(folder),
        "bandwidth_gbs": bandwidth,
        "bandwidth_before_gbs": before["best_gbs"],
        "bandwidth_after_gbs": after["best_gbs"],
        "runs": runs,
    }


def report(r: dict) -> str:
    lines = [
        f"moe ({r['model']}): read bandwidth {r['bandwidth_gbs']:.1f} GB/s "
        f"(before {r['bandwidth_before_gbs']:.1f}, after {r['bandwidth_after_gbs']:.1f})"
    ]
    for x in r["runs"]:
        lines.append(
            f"  {x['weights']} weights / {x['kv']} KV, {x['layers']} layers: "
            f"{x['weight_bytes_per_token'] / 1e6:.0f} MB/token "
            f"({x['experts_per_token_per_layer']} experts of {x['expert_bytes'] / 1e6:.2f} MB a "
            f"layer), load {x['load_s']:.1f} s, peak RSS {x['peak_rss_bytes'] / 1e9:.2f} GB"
        )
        for d in x["decode"]:
            lines.append(
                f"    decode ctx {d['context']:5d}: {d['ms_per_token']:7.2f} ms/token "
                f"(gemm {d['gemm_ms']:.2f}, attn {d['attn_ms']:.2f}), "
                f"{d['bandwidth_fraction'] * 100:.0f}% of read bandwidth "
                f"(gemm alone {d['gemm_bandwidth_fraction'] * 100:.0f}%), "
                f"{d['experts_read']} experts read"
            )
        v = x["verify"]
        ratios = [f"{k} {v[k]:.2f}" for k in v if k.startswith("V(") and k.endswith("/T")]
        lines.append("    V(K)/T: " + ", ".join(ratios))
        lines.append(
            f"    prefill {x['prefill_tokens_per_s']:.1f} tok/s; routing "
            f"{x['routing_ms_per_token']:.3f} ms/token ({x['routing_fraction'] * 100:.1f}% of "
            f"decode); lm_head {x['lm_head_ms']:.2f} ms"
        )
        p, b = x["projection_48"], x["board"]
        lines.append(
            f"    48 layers: {p['bytes_per_token'] / 1e9:.2f} GB/token, "
            f"{p['ms_per_token']:.0f} ms/token ({p['tokens_per_s']:.1f} tok/s) here; board at "
            f"{b['read_gbs']:.0f} GB/s: bound {b['bound_tokens_per_s']:.1f} tok/s, "
            f"{b['at_this_fraction_tokens_per_s']:.1f} tok/s at this run's fraction"
        )
    if "llama_cpp" in r:
        lines.append(peer_report(r["llama_cpp"]))
    return "\n".join(lines)


PEER_CHECK_LAYERS = 2  # of the tiny checkpoint (engine.moe.random.TINY) the check runs on


def check_conversion(progress=print, root=None) -> dict:
    """Greedy tokens of the tiny random MoE checkpoint: llama.cpp's qwen3moe (f32 GGUF)
    against Merlin f32/f32; equal only if the router, the stacked experts' order and layout
    and the MoE keys are written right."""
    folder = ensure_random_moe_checkpoint(PEER_CHECK_LAYERS, root, shape="tiny")
    return peer.check_greedy(folder, progress, n=16)


def run_peer(
    folder,
    formats,
    contexts,
    repeats: int = 3,
    threads: int = 2,
    flash_attn=(True,),
    check: bool = True,
    progress=print,
    gguf_dir=None,
    check_root=None,
) -> dict:
    """llama.cpp against Merlin on `folder` for the formats with a llama.cpp twin (q8: Q8_0,
    q4: Q4_0). Raises SectionUnavailable when llama.cpp cannot be built."""
    pairs = [(ours, theirs) for ours, theirs in peer.PAIRS if ours in formats]
    version = peer.ensure_llama_cpp(progress)
    result = peer.result_header(version, folder, threads, contexts, repeats)
    if check:
        result["check"] = check_conversion(progress, check_root)
    if not pairs:
        result["rounds"], result["summary"] = [], []
        return result
    paths = peer.ensure_ggufs(Path(folder), progress, [t for _, t in pairs], gguf_dir)
    result["rounds"] = peer.time_rounds(
        folder, paths, pairs, contexts, repeats, threads, flash_attn, progress
    )
    result["summary"] = peer.summarize(result)
    return result


def peer_report(p) -> str:
    if isinstance(p, str):
        return f"  llama.cpp: {p}"
    head = (
        f"  {peer.build_label(p)} on the same checkpoint, {p['threads']} threads, medians of "
        f"{p['repeats']} alternating rounds"
    )
    lines = [head]
    if p.get("check"):
        lines.append("  " + peer.check_line(p["check"]))
    if p["summary"]:
        lines += ["  " + line for line in peer.table(p["summary"])]
    else:
        lines.append("  no format with a llama.cpp twin asked (q8: Q8_0, q4: Q4_0)")
    return "\n".join(lines)


def main_section(args) -> dict:
    """The `moe` section of engine.bench.__main__."""
    formats = [w for w in args.weights.split(",") if w != "f32"] or ["q4"]
    kv = args.kv if "," not in args.kv else "q8"
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    result = run(
        args.model,
        formats=formats,
        kv=kv,
        contexts=tuple(args.contexts),
        layers=getattr(args, "moe_layers", 4),
        progress=say,
    )
    if args.no_peer:
        result["llama_cpp"] = "not run (--no-peer)"
    print(report(result), flush=True)  # Merlin's figures first: the comparison takes a while
    if args.no_peer:
        return result
    fa = tuple({"on": True, "off": False}[v] for v in args.flash_attn.split(","))
    try:
        result["llama_cpp"] = run_peer(
            result["model"],
            formats,
            tuple(args.contexts),
            args.repeats if args.repeats is not None else 3,
            args.threads or 2,
            fa,
            not args.no_check,
            progress=say,
        )
    except SectionUnavailable as e:
        result["llama_cpp"] = f"no comparison: llama.cpp is not available ({e})"
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
        result["llama_cpp"] = f"no comparison: llama.cpp's side failed ({e})"
    print(peer_report(result["llama_cpp"]))
    return result
