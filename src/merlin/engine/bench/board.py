"""`python -m merlin.engine.bench board`: a cycle model of the decode step for CPUs that are not
here (the RK3588's Cortex-A76 and A55, the Cortex-A72 of older boards), checked on this host.

Per CPU (cross.compile_asm: the engine's own kernels compiled for that core by Numba's LLVM):
  1. the block loops of the grouped q4 / q8 / q8a8 weight products, one loop per tile of N
     activation rows (loops.tile_loops), the integer-multiply loops of the attention over
     an int8 KV cache (loops.product_loops), and the main loop of each pass a query makes
     over its keys besides (attention.ROW_PASSES: the softmax's scale, max, exp, sum and
     normalisation, the weights' max and rounding to int16; each compiled as a function of
     its own, loops.stream_loop);
  2. llvm-mca's cycles per iteration of each on the core's scheduling model (mca.py): for a
     weight loop, the cycles of one 32-weight block of GROUP output rows against N activation
     rows; for the attention, cycles per integer product (the loops' cycles over their
     multiply lanes, summed over the hot loops) and cycles per key of each pass (its loop's
     cycles over the keys it loads an iteration, loops.Loop.elements), summed over the
     passes: a query and key costs 2 x head_dim products and one key of every pass;
  3. per token of the 2B shapes (demo.QWEN3VL_2B, the text decoder and its head), decode
     (N = 1) and a verify of 4 drafts (V(4), N = 5 rows, in tiles as qgroup._grouped cuts them):
       compute   = (weight blocks x cycles per block + queries x keys x (2 head_dim x
                   cycles per product + cycles of the passes a key)) / (clock x cores),
                   every core busy, nothing else counted;
       bandwidth = (weight bytes + KV bytes read) / the board's read bandwidth;
       projected = max(compute, bandwidth) (a roofline: each loop overlaps its loads).
     Norms, RoPE, activation quantization and thread start-up are left out (on this host they
     are under 10% of a step: `python -m merlin.engine.bench decode`, column "other").

Trust: the same model is built for this host (x86-64 assembly, llvm-mca for the host's core,
the clock measured with clock.chain: CHAIN_CYCLES a step) and compared with the same kernels
timed here on one thread, their data in L1 as llvm-mca assumes (the weight tiles; marginal time
per block between two sizes, so fixed costs cancel) or in L2 (the attention, a query and key:
its products and passes together). Each part, the weight products and the attention, is
trusted when all its checks agree within 25%; the report says which are and why. On an Intel
host the listings given to llvm-mca carry Intel's un-lamination (a computing instruction with a
base + index memory operand is two uops at rename; loops.Loop.text), which llvm-mca's Intel
models leave out; Arm cores have no such split. Which core's tables llvm-mca really uses
depends on its version (mca.py: LLVM 14-16 give the A76's Neoverse N1 the Cortex-A57's); the
report warns when a board's core is not on its own.

The x86 classes this host cannot time (BOARDS' x86 rows: the class's code compiled for a core
of it, llvm-mca's model of that core; 2 cores, as `bench peer`): Zen 3 for x86-avx2 at
ZEN3_GHZ, an EPYC 7763's base clock (boost 3.5; the issue's host did not say its part), and
ZEN3_READ_GBS, the middle of the 13-17 GB/s issue 20 measured on its 2-vCPU EPYC; an Alder Lake
P-core for x86-avxvnni at ALDERLAKE_GHZ (an i5-12400's all-core turbo), no bandwidth figure. Their
models are checked only as far as the host check goes (Intel's llvm-mca models, this core).
Per board the report also gives the read bandwidth up to which V(4) <= VERIFY_TARGET x T
(verify_limit_gbs): the verify is compute-bound where decode is bandwidth-bound.

Bandwidth: RK3588_READ_GBS, STREAM multi-threaded Triad on a Radxa ROCK 5B (RK3588, LPDDR4x,
2022; EntityFX/anybench pull request #39: Copy 22.0, Triad 20.0 GB/s; a Turing Pi RK1 review
reports 17-22 GB/s sequential). Triad counts its read and written bytes; a decode step only
reads, which runs at or above it. --board-bandwidth overrides it.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from functools import partial

import numpy as np
from numba import njit

from ..kernels.attention import ROW_PASSES
from ..kernels.qgroup import _grouped, tile_sizes
from . import loops, mca
from .cross import HOT_KERNELS, compile_asm
from .machine import cpuinfo

RK3588_READ_GBS = 20.0
BLOCK = 32
CONTEXTS = (128, 2048, 8192)
ROWS = (1, 2, 3, 4, 5)
TRUST_TOLERANCE = 0.25
HOST_CHECK_ROUNDS = 3  # the host check's rounds: each kernel keeps its fastest (host_check)
REPEAT_CALLS = 2000  # products a timing of the host check runs in one compiled loop
A76_FEATURES = "+neon,+fp-armv8,+crc,+lse,+rdm,+rcpc,+dotprod,+fullfp16,+ssbs"
AARCH64 = "aarch64-unknown-linux-gnu"
X86_64 = "x86_64-unknown-linux-gnu"
# the x86 cores (see the module docstring for where each figure comes from)
ZEN3_GHZ = 2.45
ZEN3_READ_GBS = 15.0
ALDERLAKE_GHZ = 4.0
# a verify of 4 drafts pays when it costs at most this many plain steps (issue 20's target)
VERIFY_TARGET = 1.25
# cycles a step of clock.chain: a dependent add and xor, one cycle each on every core this
# runs on (llvm-mca 19's Sapphire / Emerald Rapids tables give xor two, which read this
# host's clock as 5.2 GHz: docs/benchmarks.md, session 33)
CHAIN_CYCLES = 2.0


@dataclass(frozen=True)
class Board:
    name: str
    cpu: str  # LLVM CPU name Numba compiles for
    features: str  # "": the named CPU's own (without it Numba would add this host's)
    mca_cpu: str  # llvm-mca's scheduling model
    ghz: float
    cores: int
    read_gbs: float | None  # None: no published figure used; compute-bound only
    where: str
    triple: str = AARCH64
    unlaminates: bool = False  # an Intel core (loops.Loop.text)


BOARDS = (
    Board(
        "RK3588 Cortex-A76", "cortex-a76", A76_FEATURES, "neoverse-n1", 2.4, 4,
        RK3588_READ_GBS, "the RK3588's big cores (Neoverse N1 is the A76's core model)",
    ),
    Board(
        "RK3588 Cortex-A55", "cortex-a55", "+neon,+fp-armv8,+crc,+lse,+rdm,+rcpc,+dotprod,"
        "+fullfp16", "cortex-a55", 1.8, 4, RK3588_READ_GBS, "the RK3588's little cores",
    ),
    Board(
        "Cortex-A72 (no dotprod)", "cortex-a72", "+neon,+fp-armv8,+crc", "cortex-a72", 1.8, 4,
        None, "RK3399 / Raspberry Pi 4 class cores: compute only, no bandwidth figure used",
    ),
    # the x86 classes not on this host, each on a core of its class, 2 cores as `bench peer`
    Board(
        "AMD Zen 3 (x86-avx2)", "znver3", "", "znver3", ZEN3_GHZ, 2, ZEN3_READ_GBS,
        "issue 20's 2-vCPU EPYC host (AVX2, FMA, no VNNI) at an EPYC 7763's base clock",
        X86_64,
    ),
    Board(
        "Intel Alder Lake P-core (x86-avxvnni)", "alderlake", "", "alderlake", ALDERLAKE_GHZ,
        2, None, "a desktop's performance cores (AVX-VNNI): compute only", X86_64, True,
    ),
)  # fmt: skip

# formats of the decoder's linears and of its head, per weights format (text.py: q4 models
# run their head as q8 weights with int8 activations); bytes per weight incl. the bf16 scales
FORMATS = {"q4": ("q4", "q8a8"), "q8": ("q8", "q8")}
BYTES_PER_WEIGHT = {"q4": 18 / 32, "q8": 34 / 32, "q8a8": 34 / 32}


def shapes(text: dict) -> list[tuple[str, int, int, int]]:
    """(name, O, K, count per token) of the text decoder's weight products and its head."""
    d, hd, inter = text["hidden_size"], text["head_dim"], text["intermediate_size"]
    nh, nkv = text["num_attention_heads"], text["num_key_value_heads"]
    layers = text["num_hidden_layers"]
    return [
        ("qkv", (nh + 2 * nkv) * hd, d, layers),
        ("o", d, nh * hd, layers),
        ("gate_up", 2 * inter, d, layers),
        ("down", d, inter, layers),
        ("lm_head", text["vocab_size"], d, 1),
    ]


# --------------------------------------------------------------------------- the model


def analyse(asm: dict, mca_cpu: str, triple: str, tool: str, unlaminate: bool = False) -> dict:
    """llvm-mca cycles of the kernels' hot loops: per weight format {N: cycles per block of
    GROUP rows}, the attention's cycles per integer product, and per pass of ROW_PASSES its
    cycles a key. unlaminate: an Intel core's (loops.Loop.text)."""
    group = asm["group"]
    out: dict = {"group": group, "tile_rows": asm["tile_rows"], "dot": asm.get("dot")}

    def loop_cycles(loop) -> float:
        return mca.cycles_per_iteration(loop.text(unlaminate), triple, mca_cpu, tool)

    for fmt in ("q4", "q8", "q8a8"):
        if fmt in asm["asm"]:
            found = loops.tile_loops(asm["asm"][fmt], group)
            out[fmt] = {n: loop_cycles(loop) for n, loop in found.items()}
            out[fmt + "_instructions"] = {n: len(loop.body) for n, loop in found.items()}
    if "attention_q8" in asm["asm"]:
        hot = loops.product_loops(asm["asm"]["attention_q8"])
        total = sum(loop_cycles(lp) for lp in hot)
        products = sum(lp.products for lp in hot)
        out["attention_cycles_per_product"] = total / products if products else math.nan
        out["attention_loops"] = len(hot)
    passes = {}
    for name in dict.fromkeys(ROW_PASSES):
        listing = asm["asm"].get("pass" + name)
        if listing is not None:
            loop = loops.stream_loop(listing)
            passes[name] = loop_cycles(loop) / loop.elements
    if passes:
        out["pass_cycles_per_key"] = passes
    return out


def attention_cycles(model: dict, head_dim: int) -> float:
    """Cycles of one query against one key: its 2 x head_dim integer products (q.k and p.v)
    and one key of every pass of ROW_PASSES (a pass the model lacks counts nothing)."""
    passes = model.get("pass_cycles_per_key", {})
    return 2 * head_dim * model["attention_cycles_per_product"] + sum(
        passes.get(name, 0.0) for name in ROW_PASSES
    )


def cycles_per_block(model: dict, fmt: str, n: int) -> float:
    """Cycles of one 32-weight block of GROUP rows against n activation rows."""
    return sum(model[fmt][t] for t in tile_sizes(n, model["tile_rows"]))


def project(model: dict, text: dict, weights: str, n: int, context: int, ghz: float,
            cores: int, read_gbs: float | None, attention_scale: float = 1.0) -> dict:  # fmt: skip
    """ms per token (compute, bandwidth, projected) of an n-row step at `context` keys;
    attention_scale multiplies the attention's cycles (the untrusted part's sensitivity)."""
    group = model["group"]
    layer_fmt, head_fmt = FORMATS[weights]
    cycles = bytes_ = 0.0
    for name, o, k, count in shapes(text):
        fmt = head_fmt if name == "lm_head" else layer_fmt
        blocks = math.ceil(o / group) * (k // BLOCK) * count
        cycles += blocks * cycles_per_block(model, fmt, n)
        bytes_ += o * k * count * BYTES_PER_WEIGHT[fmt]
    layers, hd = text["num_hidden_layers"], text["head_dim"]
    nh, nkv = text["num_attention_heads"], text["num_key_value_heads"]
    keys = context + n
    cycles += layers * nh * n * keys * attention_cycles(model, hd) * attention_scale
    bytes_ += layers * nkv * keys * (2 * hd + 8)  # int8 K and V rows and their f32 scales
    compute_ms = cycles / (ghz * 1e9 * cores) * 1e3
    bandwidth_ms = bytes_ / (read_gbs * 1e9) * 1e3 if read_gbs else None
    projected = max(compute_ms, bandwidth_ms or 0.0)
    return {
        "read_gb": bytes_ / 1e9,
        "compute_ms": compute_ms,
        "bandwidth_ms": bandwidth_ms,
        "projected_ms": projected,
        "bound": "compute" if bandwidth_ms is None or compute_ms >= bandwidth_ms else "bandwidth",
    }


def board_report(board: Board, model: dict, text: dict, read_gbs: float | None,
                 attention_scale: float | None = None) -> dict:  # fmt: skip
    """The board's projections; attention_scale (the host check's measured / model time of
    the attention, when that part is not trusted): each projection again with the
    attention's cycles times it, to show which figures depend on the untrusted part."""
    rows, scaled = {}, {}
    for weights in FORMATS:
        for label, n in (("decode", 1), ("V(4)", 5)):
            for ctx in CONTEXTS:
                key = f"{weights} {label} {ctx}"
                args = (model, text, weights, n, ctx, board.ghz, board.cores, read_gbs)
                rows[key] = project(*args)
                if attention_scale is not None:
                    scaled[key] = project(*args, attention_scale=attention_scale)
    return {
        "board": board.name,
        "cpu": board.cpu,
        "mca_cpu": board.mca_cpu,
        "ghz": board.ghz,
        "cores": board.cores,
        "read_gbs": read_gbs,
        "where": board.where,
        "model": model,
        "per_block": {f: {n: cycles_per_block(model, f, n) for n in ROWS} for f in ("q4", "q8")},
        "projection": rows,
        "verify_limit_gbs": {w: verify_limit_gbs(rows, w, CONTEXTS[0]) for w in FORMATS},
        "attention_scale": attention_scale,
        "projection_attention_scaled": scaled,
    }


def verify_limit_gbs(rows: dict, weights: str, context: int) -> float | None:
    """The read bandwidth (GB/s, all cores) up to which a verify of 4 drafts costs at most
    VERIFY_TARGET plain steps: V(4) = max(compute5, bytes / bw) against T = max(compute1,
    bytes / bw), so once compute5 > VERIFY_TARGET x compute1 the ratio holds only while
    reading the step's bytes takes at least compute5 / VERIFY_TARGET. None: at any bandwidth."""
    one, five = rows[f"{weights} decode {context}"], rows[f"{weights} V(4) {context}"]
    if five["compute_ms"] <= VERIFY_TARGET * one["compute_ms"]:
        return None
    return VERIFY_TARGET * one["read_gb"] / (five["compute_ms"] / 1e3)


# --------------------------------------------------------------------------- this host


# cores newer than an older llvm-mca knows (Debian 12's LLVM 14 has no emeraldrapids), by the
# closest core it may know with the same instruction sets. The Sapphire Rapids family goes to
# Ice Lake server's tables first: LLVM 19's Sapphire Rapids tables (LLVM 14 had none and used
# Skylake server's) charge a VNNI dot's memory-operand latency, 13 cycles, to its accumulator,
# which forwards in 5, and put the q4 / q8 tiles 1.4-2.3x over their measured time on an
# Emerald Rapids, where Ice Lake server's (the same instructions) come within 15%
# (docs/benchmarks.md, session 33).
_SPR_TABLES = ("icelake-server", "sapphirerapids")
_SUCCESSORS = {
    "sapphirerapids": _SPR_TABLES,
    "emeraldrapids": _SPR_TABLES,
    "graniterapids": _SPR_TABLES,
    "graniterapids-d": _SPR_TABLES,
    "arrowlake": ("alderlake",),
    "arrowlake-s": ("alderlake",),
    "meteorlake": ("alderlake",),
    "lunarlake": ("alderlake",),
    "pantherlake": ("alderlake",),
    "znver5": ("znver4", "sapphirerapids", "icelake-server"),
    "znver4": ("sapphirerapids", "icelake-server"),
}
# an AVX-512 listing needs a model that parses it: x86-64-v3 (AVX2) refuses zmm registers
_AVX512_FALLBACKS = ("x86-64-v4", "sapphirerapids", "icelake-server", "skylake-avx512")


def nearest_mca_cpu(name: str, avx512: bool, known: set[str]) -> str:
    """The llvm-mca -mcpu for a host core LLVM calls `name`: the tables _SUCCESSORS gives it
    that llvm-mca knows, else its own, else a generic x86-64 level that parses the host's
    listings (AVX-512 or AVX2)."""
    fallbacks = _AVX512_FALLBACKS if avx512 else ("x86-64-v3",)
    for candidate in (*_SUCCESSORS.get(name, ()), name, *fallbacks):
        if candidate in known:
            return candidate
    return fallbacks[-1]


def host_mca_cpu(tool: str) -> str:
    """llvm-mca's name for this host's core (nearest_mca_cpu of LLVM's host CPU name)."""
    import subprocess

    from llvmlite import binding as ll

    done = subprocess.run([tool, "-mcpu=help"], capture_output=True, text=True)
    known = {line.split()[0] for line in (done.stdout + done.stderr).splitlines() if " - " in line}
    avx512 = "+avx512f" in ll.get_host_cpu_features().flatten().split(",")
    return nearest_mca_cpu(ll.get_host_cpu_name(), avx512, known)


def _intel_host() -> bool:
    """Whether this host's cores are Intel's (they un-laminate: loops.Loop.text)."""
    return cpuinfo("vendor_id") == "GenuineIntel"


class _Clock:
    """The host's clock while it runs: clock.chain timed between the kernel timings, its
    fastest step (a probe cut by a time slice of another process only reads slower)."""

    def __init__(self, cycles_per_step: float):
        from .clock import chain

        chain(np.uint64(1), 10)
        self.cycles, self.best = cycles_per_step, float("inf")

    def probe(self) -> None:
        from .clock import seconds_per_step

        self.best = min(self.best, seconds_per_step())

    @property
    def ghz(self) -> float:
        return self.cycles / self.best / 1e9


def _best_seconds(fn, clock: _Clock, repeats: int, calls: int) -> float:
    """Fastest mean time of `calls` calls of fn over `repeats` repeats, probing the clock
    before each repeat."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        clock.probe()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


@njit(nogil=True, cache=True)
def _repeat_grouped(packed, gscales, xq, dx, corr, out, reps):
    """The grouped product's tiles (qgroup._grouped, the same intrinsic per block) reps times
    over the same weights, with no call in between."""
    for _ in range(reps):
        _grouped(packed, gscales, xq, dx, corr, out)


WEIGHT_KS = (256, 1024)  # the host check's two weight widths (blocks between them: marginal)
ATTENTION_KEYS = (1024, 3072)  # the host check's two attention lengths
ATTENTION_HEAD_DIM = 128


def _per_block(times: dict) -> float:
    lo, hi = WEIGHT_KS
    return (times[hi] - times[lo]) / REPEAT_CALLS / ((hi - lo) // BLOCK)


def _weight_times(fmt: str, n: int, group: int, clock: _Clock, repeats: int) -> dict:
    """{K: seconds of REPEAT_CALLS products} of the kernel's tiles at the two widths of
    WEIGHT_KS, one thread, the weights in L1 as llvm-mca assumes (one group, at most 16 KB),
    each over REPEAT_CALLS products in one compiled loop; _per_block takes the marginal
    seconds a block between them, so the fixed costs (a tile's set-up, a call) cancel. From
    L2 the same tiles take longer (L1 refills: q4 at N = 1 19.9 against 13.1 cycles a block
    on the Xeon of session 25), which the model leaves to its bandwidth term."""
    from ..kernels import qgroup as qg

    pack = {"q4": qg.pack_q4_groups, "q8": qg.pack_q8_groups, "q8a8": qg.pack_q8a8_groups}[fmt]
    x_type = np.int16 if fmt == "q8" else np.int8
    limit = np.iinfo(x_type).max
    rng = np.random.default_rng(0)
    times = {}
    for k in WEIGHT_KS:
        scales = rng.integers(0x3A00, 0x3B00, (group, k // BLOCK)).astype(np.uint16)
        if fmt == "q4":
            qs = rng.integers(0, 256, (group, k // 2), dtype=np.uint8)
        else:
            qs = rng.integers(-127, 128, (group, k), dtype=np.int8)
        packed, gscales = pack(qs, scales)
        xq = rng.integers(-limit, limit + 1, (n, k), dtype=x_type)
        dx = np.ones((n, k // BLOCK), np.float32)
        corr = np.zeros((n, k // BLOCK), np.int32)
        out = np.empty((n, group), np.float32)
        args = (packed, gscales, xq, dx, corr, out, REPEAT_CALLS)
        times[k] = _best_seconds(partial(_repeat_grouped, *args), clock, repeats, 1)
    return times


ATTENTION_QUERIES = 2  # query heads of the host check's KV head (the 2B's group)


def _per_query_key(times: dict) -> float:
    lo, hi = ATTENTION_KEYS
    return (times[hi] - times[lo]) / (ATTENTION_QUERIES * (hi - lo))


def _attention_times(clock: _Clock, repeats: int) -> dict:
    """{keys: seconds of one attention call} of the int8-cache attention at the two lengths
    of ATTENTION_KEYS, one thread, one KV head with two query heads (the 2B's group), its
    cache in L2; _per_query_key takes the marginal seconds per query and key between them."""
    from ..kernels.attention import attention
    from ..kv_cache import KVCache

    rng = np.random.default_rng(0)
    hd, times = ATTENTION_HEAD_DIM, {}
    for keys in ATTENTION_KEYS:
        cache = KVCache(1, 1, hd, keys + 64, "q8")
        k, ks, v, vs = cache.layer(0)
        k[...] = rng.integers(-127, 128, k.shape, dtype=np.int8)
        v[...] = rng.integers(-127, 128, v.shape, dtype=np.int8)
        ks[...] = 0.01
        vs[...] = 0.01
        q = rng.standard_normal((1, ATTENTION_QUERIES, hd)).astype(np.float32)
        out = np.empty((1, ATTENTION_QUERIES * hd), np.float32)
        scale = np.float32(hd**-0.5)
        fn = partial(attention, q, k, ks, v, vs, keys - 1, scale, out)
        times[keys] = _best_seconds(fn, clock, repeats, 10)
    return times


def host_check(model: dict, rows=ROWS, repeats: int = 9, rounds: int = HOST_CHECK_ROUNDS) -> dict:
    """The host's model (cycles) against the host's kernels timed on one thread (seconds x the
    clock measured alongside): the weight tiles in L1, the attention's cache in L2. Every
    kernel is timed once a round, `rounds` rounds in a row, and each of its two sizes keeps
    its fastest time before the marginal cost is taken between them: on a shared host another
    tenant on the same core slows a port-bound loop for seconds at a time (1.3-2x on the host
    of docs/benchmarks.md, session 31), which only ever reads slower (the fastest difference
    would favour a round whose smaller size was the slowed one)."""
    import numba

    clock = _Clock(CHAIN_CYCLES)
    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    kernels = [(fmt, n, cycles_per_block(model, fmt, n)) for fmt in ("q4", "q8") for n in rows]
    kernels.append(("attention_q8", 1, attention_cycles(model, ATTENTION_HEAD_DIM)))
    best: list[dict] = [{} for _ in kernels]
    try:
        for _ in range(rounds):
            for (kernel, n, _), fastest in zip(kernels, best):
                if kernel == "attention_q8":
                    times = _attention_times(clock, repeats)
                else:
                    times = _weight_times(kernel, n, model["group"], clock, repeats)
                for size, t in times.items():
                    fastest[size] = min(fastest.get(size, math.inf), t)
    finally:
        numba.set_num_threads(saved)
    ghz = clock.ghz
    checks = []
    for (kernel, n, cycles), fastest in zip(kernels, best):
        seconds = _per_query_key(fastest) if kernel == "attention_q8" else _per_block(fastest)
        ratio = cycles / (seconds * ghz * 1e9)
        checks.append(
            {
                "kernel": kernel,
                "N": n,
                "model_cycles": cycles,
                "measured_cycles": seconds * ghz * 1e9,
                "ratio": ratio,
                "ok": abs(ratio - 1) <= TRUST_TOLERANCE,
            }
        )
    parts = {
        part: all(c["ok"] for c in checks if c["kernel"].startswith("attention") == attn)
        for part, attn in (("weights", False), ("attention", True))
    }
    return {"ghz": ghz, "checks": checks, "trusted": parts, "all_trusted": all(parts.values())}


# --------------------------------------------------------------------------- the section


def asm_cache_dir():
    """Where compiled listings are kept between runs (user cache folder, or MERLIN_ASM_CACHE)."""
    import os
    from pathlib import Path

    from platformdirs import user_cache_dir

    return Path(os.environ.get("MERLIN_ASM_CACHE") or Path(user_cache_dir("merlin")) / "asm")


def run(boards=BOARDS, read_gbs: float | None = None, progress=print) -> dict:
    """The whole section: the host check, then every board's model and projection. Raises
    mca.McaMissing (with how to install llvm-mca) before compiling anything if it is absent."""
    from llvmlite import binding as ll

    from ..demo import QWEN3VL_2B

    tool = mca.require_llvm_mca()
    text = QWEN3VL_2B.text
    host_cpu = ll.get_host_cpu_name()
    progress(f"board: compiling the kernels for this host ({host_cpu}) ...")
    cache = asm_cache_dir()
    # the host's features given: a CPU named alone compiles with them anyway, but the kernels'
    # own tuning (kernels/target.py, FUSED_DPWSSD) is added only to features given or detected
    host_asm = compile_asm(None, host_cpu, ll.get_host_cpu_features().flatten(), cache=cache)
    mca_cpu = host_mca_cpu(tool)
    host_model = analyse(host_asm, mca_cpu, "x86_64-unknown-linux-gnu", tool, _intel_host())
    progress("board: timing the host's kernels on one thread (weights in L1, attention in L2) ...")
    result = {
        "llvm_mca": tool,
        "llvm_version": mca.llvm_version(tool),
        "head_dim": text["head_dim"],
        "host": {"cpu": host_cpu, "mca_cpu": mca_cpu, "model": host_model},
        "boards": [],
    }
    check = result["host"]["check"] = host_check(host_model)
    scale = None
    if not check["trusted"]["attention"]:
        att = next(c for c in check["checks"] if c["kernel"].startswith("attention"))
        if att["model_cycles"] > 0 and att["measured_cycles"] > 0:  # (a noisy difference
            scale = att["measured_cycles"] / att["model_cycles"]  # of two timings can be <= 0)
    for board in boards:
        progress(f"board: compiling the kernels for {board.cpu} ...")
        asm = compile_asm(board.triple, board.cpu, board.features, kernels=HOT_KERNELS, cache=cache)
        model = analyse(asm, board.mca_cpu, board.triple, tool, board.unlaminates)
        gbs = board.read_gbs
        if read_gbs is not None and board.read_gbs == RK3588_READ_GBS:
            gbs = read_gbs
        report_ = board_report(board, model, text, gbs, scale)
        report_["mca_model"] = mca.scheduling_model(tool, board.triple, board.mca_cpu)
        report_["own_model"] = mca.has_own_model(tool, board.triple, board.mca_cpu)
        result["boards"].append(report_)
    return result


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def report(result: dict) -> str:
    h = result["host"]
    check = h["check"]
    lines = [
        f"board model (llvm-mca: {result['llvm_mca']}, LLVM {result.get('llvm_version', '?')})",
        f"host check: {h['cpu']} (llvm-mca -mcpu={h['mca_cpu']}), clock measured "
        f"{check['ghz']:.2f} GHz, one thread, weight tiles in L1, attention in L2; cycles, "
        "model vs measured:",
    ]
    for c in check["checks"]:
        unit = "a query and key" if c["kernel"].startswith("attention") else "per block"
        lines.append(
            f"  {c['kernel']:<12} N={c['N']}  model {c['model_cycles']:8.2f}  measured "
            f"{c['measured_cycles']:8.2f} {unit}  ratio {c['ratio']:.2f}"
            + ("" if c["ok"] else "  (outside 25%)")
        )
    for part, trusted in check["trusted"].items():
        mine = [c for c in check["checks"] if c["kernel"].startswith("attention") == (
            part == "attention")]  # fmt: skip
        bad = [c for c in mine if not c["ok"]]
        if trusted:
            lines.append(f"{part}: model TRUSTED, all {len(mine)} host checks within 25%")
            continue
        worst = max(bad, key=lambda c: abs(c["ratio"] - 1))
        lines.append(
            f"{part}: model NOT TRUSTED, {len(bad)} of {len(mine)} host checks outside 25% "
            f"(worst {worst['kernel']} N={worst['N']}: model {worst['ratio']:.2f}x the measured "
            "time); read its share of the projections as llvm-mca's estimate only"
        )
    for b in result["boards"]:
        m = b["model"]
        lines.append("")
        bw = f"{b['read_gbs']:.0f} GB/s read" if b["read_gbs"] else "no bandwidth figure"
        lines.append(
            f"{b['board']}: -mcpu={b['cpu']} (llvm-mca -mcpu={b['mca_cpu']}), {b['cores']} cores "
            f"at {b['ghz']} GHz, {bw}; {b['where']}"
        )
        if b.get("own_model") is False:
            lines.append(
                f"  WARNING: this llvm-mca schedules {b['mca_cpu']} on another core's tables "
                f"({b['mca_model']}...): install a newer one (Debian 12: apt-get install llvm-19)"
            )
        passes = m.get("pass_cycles_per_key", {})
        lines.append(
            f"  groups of {m['group']} rows, tiles of {m['tile_rows']}, dot {m['dot']}; attention "
            f"{m['attention_cycles_per_product']:.3f} cycles per int product, passes a key: "
            + " ".join(f"{name.strip('_')} {c:.2f}" for name, c in passes.items())
            + f"; a query and key {attention_cycles(m, result['head_dim']):.1f}"
        )
        lines.append(
            "  cycles per 32-weight block (per row of the group): "
            + "; ".join(
                f"{f} " + " ".join(
                    f"N={n} {c:.0f} ({c / m['group']:.1f})" for n, c in b["per_block"][f].items()
                )
                for f in ("q4", "q8")
            )
        )  # fmt: skip
        lines.append(f"  {'ms/token':<16}" + "".join(f"{'ctx ' + str(c):>24}" for c in CONTEXTS))
        lines.append(f"  {'':<16}" + f"{'compute/bw -> proj':>24}" * len(CONTEXTS))
        for weights in FORMATS:
            for label in ("decode", "V(4)"):
                cells = ""
                for ctx in CONTEXTS:
                    p = b["projection"][f"{weights} {label} {ctx}"]
                    cells += (
                        f"{_ms(p['compute_ms']):>8}/{_ms(p['bandwidth_ms']):>6} -> "
                        f"{p['projected_ms']:6.1f}"
                    )
                lines.append(f"  {weights + ' ' + label:<16}{cells}")
        lines.append(_verify_limit_line(b))
        lines.extend(_scaled_lines(b))
    lines.append(
        "\ncompute = kernel cycles / (clock x cores); bw = bytes read / read bandwidth; "
        "proj = max of the two; norms, RoPE and activation quantization not counted"
    )
    return "\n".join(lines)


def _verify_limit_line(b: dict) -> str:
    cells = []
    for weights, gbs in b["verify_limit_gbs"].items():
        if gbs is None:
            cells.append(f"{weights} at any bandwidth")
        else:
            cells.append(f"{weights} up to {gbs:.1f} GB/s ({gbs / b['cores']:.1f} a core)")
    return f"  V(4) <= {VERIFY_TARGET} T at ctx {CONTEXTS[0]} while reading: " + "; ".join(cells)


def _scaled_lines(b: dict) -> list[str]:
    """The projections again with the attention at the host check's measured / model ratio
    (when the attention part is not trusted): which figures move, and whether their bound does."""
    scaled = b.get("projection_attention_scaled")
    if not scaled:
        return []
    lines = [
        f"  with the attention's cycles x {b['attention_scale']:.2f} (the host check's measured"
        " / model), projected ms:"
    ]
    for weights in FORMATS:
        for label in ("decode", "V(4)"):
            cells = ""
            for ctx in CONTEXTS:
                key = f"{weights} {label} {ctx}"
                p, base = scaled[key], b["projection"][key]
                moved = "" if p["bound"] == base["bound"] else f" ({p['bound']})"
                cells += f"{p['projected_ms']:>16.1f}{moved:<8}"
            lines.append(f"  {weights + ' ' + label:<16}{cells}")
    return lines


def add_arguments(p) -> None:
    from .sections import positive_float

    p.add_argument(
        "--board-bandwidth",
        type=positive_float,
        default=None,
        help=f"board: the RK3588's read bandwidth in GB/s (default {RK3588_READ_GBS}; the "
        "other rows keep theirs)",
    )


def section(args) -> dict:
    """Run with the parsed arguments, print the report, return the figures."""
    from .sections import SectionUnavailable

    try:
        result = run(read_gbs=args.board_bandwidth, progress=lambda m: print(m, file=sys.stderr))
    except mca.McaMissing as e:
        raise SectionUnavailable(str(e)) from None
    print(report(result))
    return result
