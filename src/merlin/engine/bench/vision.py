"""`python -m merlin.engine.bench vision`: the vision encoder's figures.

Qwen3-VL-2B-sized random vision weights (the cached 2B-shaped random checkpoint of
engine.demo, built on first use), a 448x448 and a 1024x768 image written as PNG and read back
through the real preprocessing: preprocessing ms, encoder ms, GFLOP/s of the encoder (all of it
and its weight matrix products alone), and BLAS sgemm GFLOP/s measured in the same run on the
same shapes. The host may be shared: every figure is a median, and the encoder's GFLOP/s is
also given as a ratio to sgemm.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = ((448, 448), (1024, 768))  # (width, height)


def _median(fn, repeats: int) -> tuple[float, object]:
    times, last = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), last


def sgemm_gflops(m: int, k: int, n: int, repeats: int = 5) -> float:
    """GFLOP/s of np.matmul([m, k], [n, k].T): the encoder's layout (weights [out, in])."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    np.matmul(a, b.T, out=out)
    s, _ = _median(lambda: np.matmul(a, b.T, out=out), repeats)
    return 2 * m * k * n / s / 1e9


def bench_image(width: int, height: int, path: Path) -> Path:
    """A deterministic photo-like image (smooth waves, a ramp, noise) saved as PNG."""
    from PIL import Image

    rng = np.random.default_rng(width * 7919 + height)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    chans = [
        128 + 60 * np.sin(x * f1 + y * f2) + 40 * (x / width - y / height)
        for f1, f2 in rng.uniform(0.005, 0.05, (3, 2))
    ]
    img = np.stack(chans, -1) + rng.normal(0, 8, (height, width, 3))
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(path)
    return path


def load_2b_vision(cache_root: Path | None = None, progress=print):
    """VisionModel of the 2B-shaped random checkpoint (built and cached on first use)."""
    from ..checkpoint import Checkpoint
    from ..config import load_config
    from ..demo import QWEN3VL_2B, ensure_random_checkpoint, random_checkpoint_dir
    from ..vision.model import load_vision

    folder = random_checkpoint_dir(QWEN3VL_2B, cache_root)
    if not (folder / "model.safetensors").is_file():
        progress(f"building the 2B-shaped random checkpoint once (4.3 GB) in {folder} ...")
    folder = ensure_random_checkpoint(QWEN3VL_2B, cache_root)
    cfg = load_config(folder)
    t0 = time.perf_counter()
    with Checkpoint(folder) as ckpt:
        vision = load_vision(folder, ckpt, cfg)
    vision.require()
    return vision, folder, time.perf_counter() - t0


def run(sizes=SIZES, repeats: int = 3, cache_root: Path | None = None, progress=print) -> dict:
    """All figures as one dict (see the module docstring)."""
    from ..vision.encoder import VisionEncoder

    vision, folder, load_s = load_2b_vision(cache_root, progress)
    enc: VisionEncoder = vision.encoder
    cfg = enc.cfg
    result = {
        "checkpoint": str(folder),
        "vision_params": int(enc.w.nbytes // 4),
        "load_s": round(load_s, 3),
        "repeats": repeats,
        "images": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up: Numba kernels compiled or loaded from the cache, BLAS threads started
        warm = bench_image(64, 64, Path(tmp) / "warm.png")
        t0 = time.perf_counter()
        vision.encode([vision.prepare(warm)])
        result["warmup_s"] = round(time.perf_counter() - t0, 3)
        for width, height in sizes:
            path = bench_image(width, height, Path(tmp) / f"{width}x{height}.png")
            pre_s, image = _median(lambda p=path: vision.prepare(p), max(repeats, 5))
            n = image.pixel_values.shape[0]
            progress(f"encoding {width}x{height}: {n} patches, {image.n_tokens} tokens ...")
            runs = []  # (encoder output, sgemm GFLOP/s measured right before it)
            for _ in range(repeats):
                sg = {
                    "qkv": sgemm_gflops(n, cfg.hidden_size, 3 * cfg.hidden_size, 3),
                    "fc1": sgemm_gflops(n, cfg.hidden_size, cfg.intermediate_size, 3),
                    "fc2": sgemm_gflops(n, cfg.intermediate_size, cfg.hidden_size, 3),
                }
                runs.append((vision.encode([image]), float(np.median(list(sg.values()))), sg))
            runs.sort(key=lambda r: r[0].ms)
            out, sgemm, sg = runs[len(runs) // 2]  # the median run
            best = runs[0][0]
            sgemm_best = max(r[1] for r in runs)
            flops = out.flops
            gflops = flops["total"] / out.ms / 1e6
            gemm_gflops = flops["gemm"] / out.gemm_ms / 1e6
            result["images"].append(
                {
                    "size": [width, height],
                    "resized": list(image.resized_size),
                    "patches": n,
                    "tokens": image.n_tokens,
                    "preprocess_ms": round(pre_s * 1e3, 2),
                    "encoder_ms": round(out.ms, 1),
                    "encoder_ms_best": round(best.ms, 1),
                    "gemm_ms": round(out.gemm_ms, 1),
                    "attn_ms": round(out.attn_ms, 1),
                    "other_ms": round(out.ms - out.gemm_ms - out.attn_ms, 1),
                    "gflop": round(flops["total"] / 1e9, 1),
                    "gflop_gemm": round(flops["gemm"] / 1e9, 1),
                    "gflop_attn": round(flops["attn"] / 1e9, 1),
                    "encoder_gflops": round(gflops, 1),
                    "encoder_gflops_best": round(flops["total"] / best.ms / 1e6, 1),
                    "gemm_gflops": round(gemm_gflops, 1),
                    "gemm_gflops_best": round(flops["gemm"] / best.gemm_ms / 1e6, 1),
                    "sgemm_gflops": round(sgemm, 1),
                    "sgemm_gflops_best": round(sgemm_best, 1),
                    "sgemm_by_shape": {k: round(v, 1) for k, v in sg.items()},
                    "encoder_vs_sgemm": round(gflops / sgemm, 3),
                    "gemm_vs_sgemm": round(gemm_gflops / sgemm, 3),
                    "best_encoder_vs_best_sgemm": round(
                        flops["total"] / best.ms / 1e6 / sgemm_best, 3
                    ),
                }
            )
    return result


def report(result: dict) -> str:
    lines = [
        f"vision encoder, Qwen3-VL-2B shapes ({result['vision_params'] / 1e6:.0f}M params, f32); "
        f"median run of {result['repeats']} (sgemm measured right before each run); "
        f"warm-up {result['warmup_s']:.2f} s",
        f"{'image':>10} {'tokens':>6} {'prep ms':>8} {'enc ms':>9} {'gemm':>8} {'attn':>8} "
        f"{'other':>7} {'GFLOP':>7} {'GFLOP/s':>8} {'gemm':>7} {'sgemm':>7} {'ratio':>6} "
        f"{'best ms':>9} {'ratio':>6}",
    ]
    for r in result["images"]:
        lines.append(
            f"{r['size'][0]:>4}x{r['size'][1]:<5} {r['tokens']:>6} {r['preprocess_ms']:>8.1f} "
            f"{r['encoder_ms']:>9.1f} {r['gemm_ms']:>8.1f} {r['attn_ms']:>8.1f} "
            f"{r['other_ms']:>7.1f} {r['gflop']:>7.1f} {r['encoder_gflops']:>8.1f} "
            f"{r['gemm_gflops']:>7.1f} {r['sgemm_gflops']:>7.1f} {r['encoder_vs_sgemm']:>6.2f} "
            f"{r['encoder_ms_best']:>9.1f} {r['best_encoder_vs_best_sgemm']:>6.2f}"
        )
    lines.append(
        "GFLOP/s = all encoder FLOPs / encoder time; gemm = weight products alone; ratio = "
        "encoder GFLOP/s / sgemm GFLOP/s (same shapes, same run); best = fastest run vs "
        "fastest sgemm (least disturbed by other work on the host)"
    )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .sections import image_size

    p.add_argument(
        "--size", action="append", type=image_size, default=None,
        help="vision: image WxH (repeatable; default 448x448 and 1024x768)",
    )  # fmt: skip


def section(args) -> dict:
    """Run with the parsed arguments (--repeats is shared with the kernels section; the
    vision default is 3), print the report, return the figures."""
    sizes = tuple(args.size) if args.size else SIZES
    repeats = args.repeats if args.repeats is not None else 3
    result = run(sizes, repeats, progress=lambda m: print(m, file=sys.stderr))
    print(report(result))
    return result
