"""Image questions, end to end, for `python -m merlin.engine.bench vision` (also
`python -m merlin.engine.bench.vision_ttft`): the vision encoder in f32 (BLAS, the reference)
and q8 (grouped integer kernels, fused int8 attention) in the same run, and the time to the
first answer token.

On the 2B-shaped random checkpoint (engine.demo.QWEN3VL_2B, built and cached on first use),
for square pictures of 256, 1024 and 4096 image tokens (512, 1024, 2048 pixels a side):

- encode ms f32 and q8, alternating in one process (medians of `repeats`), their ratio,
  GFLOP/s of each (all encoder FLOPs / time; the weight products alone as gemm GFLOP/s) and
  the fraction of NumPy sgemm measured right before, on the fc1 shape (rows = patches);
- time to first token of a one-image question with q8 vision: from Session.ask() to the
  first streamed token (preprocessing + encode + prefill of the whole prompt + the first
  decode step), a fresh session and an empty embedding cache each time; also for 448x448
  (196 tokens), the issue's target picture, and for it as the app gives it when the picture
  was attached before the question was typed (encoded and its rows prefilled on attach,
  Session.prefill_ahead; only the question's text and the first step after Send);
- the board projection (RK3588, 4 Cortex-A76): each measured part's time scaled by the ratio
  of this host's peak, measured in the same run (peaks.py), to the A76 cluster's (BOARD below
  says where those come from) for that kind of work: the weight products and the attention
  by the integer-dot peak (q8: both are int8 dots) or the f32 FMA peak, the element-wise
  rest by the f32 peak of all cores (q8: its rows split over the threads) or of one core
  (f32). It assumes the kernels reach the same fraction of peak there as here; the decoder's
  own cycle model for aarch64 is bench/board.py.

The host may be shared: every figure is a median, f32 and q8 alternate, and ratios (f32/q8,
fraction of sgemm) are the figures to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKENS = (256, 1024, 4096)
TARGET_SIZE = (448, 448)

# The board's peak throughputs, per core and cycle (multiply-adds count 2): Arm Cortex-A76
# Software Optimization Guide (ASIMD FMLA and SDOT: 2 a cycle on the two 128-bit pipes: 16 f32
# FLOP, 64 int8 ops), 4 cores at 2.4 GHz (RK3588 datasheet: A76 cluster up to 2.4 GHz). This
# host's are measured in the same run (peaks.py: the f32 fma and the class's int8 dot).
BOARD = {"cores": 4, "ghz": 2.4, "f32": 16, "int8": 64}
NPU_448_S = 2.08  # rknn-llm's published Qwen3-VL-2B vision encode of 448x448 on the RK3588 NPU


def board_peaks() -> dict:
    """The board's peak G ops/s, in peaks.measure()'s keys."""
    cluster = BOARD["ghz"] * BOARD["cores"]
    return {
        "f32": BOARD["f32"] * cluster,
        "int8": BOARD["int8"] * cluster,
        "f32_core": BOARD["f32"] * BOARD["ghz"],
        "int8_core": BOARD["int8"] * BOARD["ghz"],
    }


def board_seconds(out, fmt: str, host: dict) -> float:
    """Projected encode seconds on the board for one measured VisionOutput: each part's time
    times host peak / board peak for its kind of work (host: peaks.measure())."""
    board = board_peaks()

    def scaled(ms, key):
        return ms / 1e3 * host[key] / board[key]

    kind = "int8" if fmt == "q8" else "f32"  # q8: integer weight and attention products
    # the element-wise rest: on every thread in q8 (VisionEncoder._by_rows), one in f32
    rest = "f32" if fmt == "q8" else "f32_core"
    other = max(0.0, out.ms - out.gemm_ms - out.attn_ms)
    return scaled(out.gemm_ms, kind) + scaled(out.attn_ms, kind) + scaled(other, rest)


def _side(tokens: int, factor: int) -> int:
    return int(round(tokens**0.5)) * factor


def _encode_figures(vision, image, repeats: int, host: dict) -> dict:
    import numba

    from .vision import sgemm_gflops

    enc = vision.encoder
    n = image.pixel_values.shape[0]
    runs = {"f32": [], "q8": []}
    cpu = {"f32": [], "q8": []}
    sgemm = []
    for _ in range(repeats):
        sgemm.append(sgemm_gflops(n, enc.cfg.hidden_size, enc.cfg.intermediate_size, 3))
        for fmt in ("f32", "q8"):
            vision.set_weights_format(fmt)
            c0 = time.process_time()
            runs[fmt].append(vision.encode([image]))
            cpu[fmt].append(time.process_time() - c0)
    vision.set_weights_format("q8")
    sg = float(np.median(sgemm))
    row = {"patches": n, "tokens": image.n_tokens, "sgemm_gflops": round(sg, 1)}
    for fmt, outs in runs.items():
        outs.sort(key=lambda o: o.ms)
        out = outs[len(outs) // 2]
        gflops = out.flops["total"] / out.ms / 1e6
        row[fmt] = {
            "encode_ms": round(out.ms, 1),
            "gemm_ms": round(out.gemm_ms, 1),
            "attn_ms": round(out.attn_ms, 1),
            "gflops": round(gflops, 1),
            "gemm_gflops": round(out.flops["gemm"] / out.gemm_ms / 1e6, 1),
            "attn_gflops": round(out.flops["attn"] / max(out.attn_ms, 1e-9) / 1e6, 1),
            "vs_sgemm": round(gflops / sg, 3),
            "board_s": round(board_seconds(out, fmt, host), 2),
            # CPU seconds of the process over the encode: on a shared, overloaded host the
            # wall time stretches, the work does not (CPU s / threads ~ the unshared time)
            "cpu_s": round(float(np.median(cpu[fmt])), 2),
        }
        # the same projection from CPU time / threads instead of wall time (a shared host)
        busy = float(np.median(cpu[fmt])) / max(1, numba.get_num_threads())
        row[fmt]["board_cpu_s"] = round(row[fmt]["board_s"] * busy / (out.ms / 1e3), 2)
    row["f32_over_q8"] = round(row["f32"]["encode_ms"] / row["q8"]["encode_ms"], 2)
    a, b = runs["f32"][0], runs["q8"][0]
    row["cosine"] = {
        "embeds": round(_cosine(a.embeds, b.embeds), 6),
        "deepstack_min": round(min(_cosine(x, y) for x, y in zip(a.deepstack, b.deepstack)), 6),
    }
    return row


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def greedy_f32_vs_q8(model, path: Path, tokens: int, n: int = 8) -> dict:
    """The greedy answer (n tokens) of a one-image question with f32 and with q8 vision."""
    from ..generate import Tokens
    from ..sampling import SamplingParams
    from ..session import Session, SessionSettings

    answers = {}
    for fmt in ("f32", "q8"):
        model.vision.set_weights_format(fmt)
        s = Session(model, settings=SessionSettings(context_budget=8192, image_tokens=tokens))
        ids = []
        for ev in s.ask("What is in this picture?", images=[path],
                        sampling=SamplingParams(temperature=0.0), max_new_tokens=n,
                        ignore_eos=True):  # fmt: skip
            if isinstance(ev, Tokens):
                ids += ev.ids
        answers[fmt] = ids
    model.vision.set_weights_format("q8")
    return {"greedy_same": answers["f32"] == answers["q8"], **answers}


def _ttft(model, path: Path, tokens: int, repeats: int) -> dict:
    from ..generate import PrefillDone, Tokens
    from ..sampling import SamplingParams
    from ..session import Session, SessionSettings

    greedy = SamplingParams(temperature=0.0)
    times, cpus, info = [], [], {}
    for _ in range(repeats):
        c0 = time.process_time()
        model.vision.embeddings = type(model.vision.embeddings)()
        s = Session(model, settings=SessionSettings(context_budget=8192, image_tokens=tokens))
        t0 = time.perf_counter()
        first = None
        for ev in s.ask("What is in this picture?", images=[path], sampling=greedy,
                        max_new_tokens=1, ignore_eos=True):  # fmt: skip
            if isinstance(ev, PrefillDone):
                info = {"prompt_tokens": ev.n_tokens, "vision_ms": round(ev.vision_ms, 1),
                        "prefill_ms": round(ev.prefill_ms, 1)}  # fmt: skip
            if isinstance(ev, Tokens) and first is None:
                first = time.perf_counter() - t0
                cpus.append(time.process_time() - c0)
        times.append(first)
    return {
        "ttft_s": round(float(np.median(times)), 3),
        "ttft_cpu_s": round(float(np.median(cpus)), 3),
        **info,
    }


def _ttft_after_attach(model, path: Path, tokens: int, repeats: int) -> dict:
    """Time to first token as the app gives it when the picture was attached before the
    question was typed: the session encoded it and prefilled the turn's opening and its
    rows then (Session.encode_image, prefill_ahead: the work done while typing, timed
    apart), and ask() computes the question's text and the first step."""
    from ..generate import PrefillDone, Tokens
    from ..sampling import SamplingParams
    from ..session import Session, SessionSettings

    greedy = SamplingParams(temperature=0.0)
    times, ahead_ms, info = [], [], {}
    for _ in range(repeats):
        model.vision.embeddings = type(model.vision.embeddings)()
        s = Session(model, settings=SessionSettings(context_budget=8192, image_tokens=tokens))
        t0 = time.perf_counter()
        im = s.encode_image(path)
        s.prefill_ahead([im])
        ahead_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        first = None
        for ev in s.ask("What is in this picture?", images=[path], sampling=greedy,
                        max_new_tokens=1, ignore_eos=True):  # fmt: skip
            if isinstance(ev, PrefillDone):
                info = {"after_attach_prefill_tokens": ev.n_tokens,
                        "after_attach_reused": ev.reused}  # fmt: skip
            if isinstance(ev, Tokens) and first is None:
                first = time.perf_counter() - t0
        times.append(first)
    return {
        "ttft_after_attach_s": round(float(np.median(times)), 3),
        "while_typing_ms": round(float(np.median(ahead_ms)), 1),
        **info,
    }


def run(tokens=TOKENS, repeats: int = 3, weights: str = "q4", progress=print, folder=None) -> dict:
    """The figures on `folder` (default: the 2B-shaped random checkpoint, built once)."""
    from ..demo import QWEN3VL_2B, ensure_random_checkpoint
    from ..model import load_model
    from .peaks import measure as measure_peaks
    from .vision import bench_image

    if folder is None:
        folder = ensure_random_checkpoint(QWEN3VL_2B, on_build=lambda: progress("building 2B"))
    model = load_model(folder, weights=weights, kv="q8", vision_weights="q8")
    vision = model.vision
    factor = vision.preprocess.factor
    import os

    import numba

    result = {"threads": numba.get_num_threads(), "load_avg": list(os.getloadavg()),
              "checkpoint": str(folder), "text_weights": weights, "repeats": repeats,
              "encoder": {"depth": vision.encoder.cfg.depth,
                          "width": vision.encoder.cfg.hidden_size,
                          "mlp": vision.encoder.cfg.intermediate_size},
              "host_peaks": measure_peaks(), "board": BOARD, "budgets": []}  # fmt: skip
    host = result["host_peaks"]
    with tempfile.TemporaryDirectory() as tmp:
        warm = bench_image(64, 64, Path(tmp) / "warm.png")
        for fmt in ("f32", "q8"):  # kernels compiled, q8 matrices made, BLAS threads up
            vision.set_weights_format(fmt)
            vision.encode([vision.prepare(warm)])
        vision.set_weights_format("q8")
        _ttft(model, warm, 64, 1)
        sizes = [(t, _side(t, factor)) for t in tokens]
        for t, side in sizes:
            path = bench_image(side, side, Path(tmp) / f"{side}.png")
            image = vision.prepare(path, t * factor * factor)
            progress(f"{side}x{side}: {image.n_tokens} tokens, f32 and q8 encodes ...")
            row = {"size": [side, side], **_encode_figures(vision, image, repeats, host)}
            progress(f"{side}x{side}: time to first token ...")
            row.update(_ttft(model, path, t, max(1, repeats if t <= 1024 else 1)))
            result["budgets"].append(row)
        w, h = TARGET_SIZE
        path = bench_image(w, h, Path(tmp) / "target.png")
        image = vision.prepare(path, 1024 * factor * factor)
        progress(f"{w}x{h}: {image.n_tokens} tokens ...")
        target = {"size": [w, h], **_encode_figures(vision, image, repeats, host)}
        target.update(_ttft(model, path, 1024, repeats))
        target.update(_ttft_after_attach(model, path, 1024, repeats))
        target["npu_s"] = NPU_448_S
        progress(f"{w}x{h}: greedy answers with f32 and q8 vision ...")
        target["greedy"] = greedy_f32_vs_q8(model, path, 1024)
        result["target"] = target
    return result


def report(r: dict) -> str:
    lines = [
        f"{r['threads']} threads, load average at the start {r['load_avg'][0]:.1f}",
        f"image questions, random weights in {Path(r['checkpoint']).name}: vision encoder "
        f"{r['encoder']['depth']} blocks of width {r['encoder']['width']}, MLP "
        f"{r['encoder']['mlp']}; text {r['text_weights']}, "
        f"medians of {r['repeats']}; encode f32 and q8 alternating in one process",
        f"{'picture':>11} {'tokens':>6} {'f32 ms':>9} {'q8 ms':>9} {'f32/q8':>6} "
        f"{'f32 GF/s':>8} {'q8 GF/s':>8} {'q8 gemm':>8} {'sgemm':>6} {'f32/sg':>6} "
        f"{'q8/sg':>6} {'TTFT s':>7} {'board s':>7} {'f32 cpu':>7} {'q8 cpu':>7} {'TTFT cpu':>8}",
    ]
    for row in [*r["budgets"], r["target"]]:
        f, q = row["f32"], row["q8"]
        lines.append(
            f"{row['size'][0]:>5}x{row['size'][1]:<5} {row['tokens']:>6} {f['encode_ms']:>9.0f} "
            f"{q['encode_ms']:>9.0f} {row['f32_over_q8']:>6.2f} {f['gflops']:>8.1f} "
            f"{q['gflops']:>8.1f} {q['gemm_gflops']:>8.1f} {row['sgemm_gflops']:>6.1f} "
            f"{f['vs_sgemm']:>6.2f} {q['vs_sgemm']:>6.2f} {row['ttft_s']:>7.2f} "
            f"{q['board_s']:>7.2f} {f['cpu_s']:>7.1f} {q['cpu_s']:>7.1f} {row['ttft_cpu_s']:>8.1f}"
        )
    t = r["target"]
    lines.append(
        f"448x448: TTFT {t['ttft_s']:.2f} s (encode {t['vision_ms']:.0f} ms + prefill "
        f"{t['prefill_ms']:.0f} ms of {t['prompt_tokens']} tokens + first step); board "
        f"projection of the q8 encode {t['q8']['board_s']:.2f} s (from CPU time: "
        f"{t['q8']['board_cpu_s']:.2f} s) vs the NPU's {t['npu_s']} s"
    )
    h, b = r["host_peaks"], board_peaks()
    lines.append(
        f"peaks, G ops/s (multiply-add = 2): this host, measured on {h['threads']} threads, "
        f"f32 {h['f32']:.0f}, int8 {h['int8']:.0f} (one core f32 {h['f32_core']:.0f}); "
        f"the board, nominal, f32 {b['f32']:.0f}, int8 {b['int8']:.0f} (one core "
        f"f32 {b['f32_core']:.0f})"
    )
    lines.append(
        f"448x448 attached before the question is typed: TTFT {t['ttft_after_attach_s']:.2f} s "
        f"(prefill of {t['after_attach_prefill_tokens']} tokens, "
        f"{t['after_attach_reused']} computed while typing in {t['while_typing_ms']:.0f} ms)"
    )
    lines.append(
        "q8 vs f32: cosine of embeddings "
        + ", ".join(f"{row['tokens']}: {row['cosine']['embeds']:.5f}" for row in [*r["budgets"], t])
        + "; DeepStack (worst level) "
        + ", ".join(f"{row['cosine']['deepstack_min']:.5f}" for row in [*r["budgets"], t])
        + f"; greedy answer of the 448x448 question the same: {t['greedy']['greedy_same']}"
    )
    lines.append(
        "GF/s = encoder FLOPs / encode time (q8: integer products counted as FLOPs); "
        "x/sg = that over sgemm on the fc1 shape, same run; TTFT = ask() to first token "
        "(preprocess + q8 encode + prefill + first step); board = q8 encode scaled by this "
        "host's measured peaks over the board's (engine/bench/vision_ttft.py: BOARD, peaks.py)"
    )
    return "\n".join(lines)


def section(progress=print) -> dict:
    """`python -m merlin.engine.bench vision`: run with the defaults, print the table, return
    the figures (the one line that registers this module there)."""
    result = run(progress=progress)
    print(report(result))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    p.add_argument("--weights", default="q4", help="text weights (default q4, the app's)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--shape", choices=("2b", "8b"), default="2b",
        help="2b: the 2B-shaped random checkpoint; 8b: the 8B's vision encoder (its MLP of "
        "4,304 stays f32 in q8) before a one-layer text model (its time to first token is "
        "not the 8B's)",
    )  # fmt: skip
    args = p.parse_args(argv)
    folder = None
    if args.shape == "8b":
        from ..demo import QWEN3VL_8B_VISION, ensure_random_checkpoint

        folder = ensure_random_checkpoint(
            QWEN3VL_8B_VISION, on_build=lambda: print("building 8B vision", file=sys.stderr)
        )
    result = run(tuple(args.tokens), args.repeats, args.weights,
                 progress=lambda m: print(m, file=sys.stderr), folder=folder)  # fmt: skip
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
