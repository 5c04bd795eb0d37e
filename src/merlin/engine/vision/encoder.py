"""Qwen3-VL vision encoder (spec section 4): pixel patches -> image embeddings + DeepStack.

patch embed (Conv3d == one matmul) + bilinearly interpolated learned position embeddings ->
depth x [LayerNorm, qkv, 2D RoPE, bidirectional attention within each image, proj, LayerNorm,
fc1, tanh-GELU, fc2] -> 2x2 patch merger (LayerNorm, fc1, erf-GELU, fc2); the DeepStack mergers
take the outputs of the blocks listed in deepstack_visual_indexes (LayerNorm after the 2x2
shuffle). Tokens stay in 2x2-merge-block order throughout, the order of the pixel patches.

Weight formats (VisionEncoder.weights_format, `--vision-weights`): "f32", every matrix product
a NumPy BLAS call on the widened checkpoint matrices (the reference); "q8", the block and
merger matrices quantized once to q8_0 and multiplied by the grouped integer kernels with int8
activations per block of 32 (engine/vision/qweights.py; the text model's q8a8 path), the
patch embedding staying f32 BLAS, and the attention through the fused int8 kernel
(engine/vision/attention.py, attention_int8). The
element-wise work between products is in single-threaded Numba kernels
(engine/vision/kernels.py says why). Activations are float32.

forward() takes `cancel` (an Event, checked between blocks: EncodeCancelled) and `progress`
(called with (0, depth) before the first block and (blocks done, depth) after each), so an
encode started while the user types can be stopped within one block's time.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import VisionConfig
from ..errors import CheckpointError, InputError
from ..threads import one_thread
from . import qweights
from .attention import (  # noqa: F401 (engine.memory reads ATTN_CHUNK_ELEMS)
    ATTN_CHUNK_ELEMS,
    attention,
    attention_int8,
    thread_pool,
)
from .kernels import (
    POW2,
    add_bias,
    add_bias_residual,
    bias_gelu_erf,
    bias_gelu_tanh,
    layernorm,
    split_heads_rope,
)
from .stored import StoredWeight
from .weights import MergerWeights, VisionWeights

LN_EPS = 1e-6
ROPE_THETA = 10000.0
MLP_CHUNK_ROWS = 2048  # bounds the [rows, intermediate] activation
VISION_WEIGHTS = ("f32", "q8")


class EncodeCancelled(Exception):
    """The encode was stopped between blocks (its cancel Event was set)."""


@dataclass
class VisionTimer:
    gemm: float = 0.0  # seconds in weight matrix products
    attn: float = 0.0  # seconds in attention (score and value products, softmax)


@dataclass
class VisionOutput:
    """embeds: [M, out_hidden] rows for the image pads (all images in order); deepstack: one
    [M, out_hidden] per DeepStack level, added after decoder layers 0, 1, ...; counts: tokens
    per image."""

    embeds: np.ndarray
    deepstack: list[np.ndarray]
    counts: list[int]
    ms: float = 0.0
    gemm_ms: float = 0.0
    attn_ms: float = 0.0
    flops: dict = field(default_factory=dict)


def merge_block_rows_cols(h: int, w: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Patch (row, col) of each token of an h x w grid in merge-block order (bh, bw, mh, mw)."""
    bh, bw, mh, mw = np.meshgrid(
        np.arange(h // m), np.arange(w // m), np.arange(m), np.arange(m), indexing="ij"
    )
    return (bh * m + mh).ravel(), (bw * m + mw).ravel()


# An encode whose multiply-adds in the matrices (patches x their weights) are fewer than this
# runs its kernels on the calling thread: waking the pool for each small product and
# element-wise pass cost more than it saved (docs/benchmarks.md, "The demo model's picture
# on one kernel thread"); a real checkpoint's encoder (hundreds of millions of weights)
# always uses the pool.
SERIAL_ENCODE_MACS = 4_000_000_000


class VisionEncoder:
    def __init__(self, cfg: VisionConfig, weights: VisionWeights, weights_format: str = "f32"):
        self.cfg = cfg
        self.w = weights
        # matrix weights a patch passes through (the merger's run once per 4 patches: counted
        # whole, an upper bound), for SERIAL_ENCODE_MACS
        self._weights_per_patch = int(weights.patch_w.size) + sum(
            math.prod(w.shape) for w in weights.stored
        )
        self.weights_format = "f32"
        self.set_weights_format(weights_format)
        self.side = math.isqrt(cfg.num_position_embeddings)
        if self.side * self.side != cfg.num_position_embeddings:
            raise CheckpointError(
                f"vision num_position_embeddings ({cfg.num_position_embeddings}) is not a "
                "square number; Qwen3-VL's learned position grid is square."
            )
        hd = cfg.head_dim
        theta = float(getattr(cfg, "rope_theta", ROPE_THETA))
        sd = hd // 2
        exps = np.arange(0, sd, 2, dtype=np.float32) / np.float32(sd)
        self.inv_freq = (np.float32(1.0) / (np.float32(theta) ** exps)).astype(np.float32)
        self.scale = np.float32(hd**-0.5)
        self._grid_cache: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    def set_weights_format(self, fmt: str) -> None:
        """'f32' (BLAS on the widened checkpoint matrices, the reference) or 'q8' (grouped
        integer kernels; the matrices are quantized at the first q8 encode and kept)."""
        if fmt not in VISION_WEIGHTS:
            raise InputError(
                f"unknown vision weights format {fmt!r}; choose {' or '.join(VISION_WEIGHTS)}."
            )
        if fmt == "q8" and not qweights.quantizable(self.w.stored):
            raise InputError(
                "none of this vision encoder's matrices can be quantized to q8 (no input "
                "width is a multiple of 32); use --vision-weights f32."
            )
        self.weights_format = fmt

    def _ready(self, weight: StoredWeight, role: str, scratch):
        """The matrix in the encoder's weights format: f32 [O, K] or a q8 GroupLinear (f32
        in a q8 encoder too when its input width is not a multiple of 32)."""
        if self.weights_format == "q8" and qweights.runs_q8(weight):
            return qweights.q8_linear(weight, scratch)
        return weight.f32(scratch, role)

    @staticmethod
    def _apply(w, x: np.ndarray, out=None) -> np.ndarray:
        """x @ w.T for a matrix from _ready()."""
        if isinstance(w, np.ndarray):
            return np.matmul(x, w.T) if out is None else np.matmul(x, w.T, out=out)
        return qweights.apply(w, x, out)

    def _mm(self, x: np.ndarray, weight: StoredWeight, role: str, scratch, out=None):
        return self._apply(self._ready(weight, role, scratch), x, out)

    # ---- per-grid tables ---------------------------------------------------------------------

    def _grid_tables(self, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pos_embed [h*w, VD], cos [h*w, HD/2], sin) for one frame in merge-block order."""
        key = (h, w)
        hit = self._grid_cache.get(key)
        if hit is not None:
            return hit
        m = self.cfg.spatial_merge_size
        rows, cols = merge_block_rows_cols(h, w, m)
        pe = self._interpolated_pos_embed(rows, cols, h, w)
        f_r = rows.astype(np.float32)[:, None] * self.inv_freq
        f_c = cols.astype(np.float32)[:, None] * self.inv_freq
        freqs = np.concatenate([f_r, f_c], axis=1)  # [S, HD/2]
        out = (pe, np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32))
        if len(self._grid_cache) > 16:
            self._grid_cache.clear()
        self._grid_cache[key] = out
        return out

    def _interpolated_pos_embed(self, rows, cols, h: int, w: int) -> np.ndarray:
        """Bilinear, align-corners resampling of the square learned grid to h x w, computed as
        transformers 5.x does (float32 source coordinates, ceil index clamped to the edge)."""
        side = self.side
        table = self.w.pos_embed

        def taps(index, size):
            src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
            lo = np.floor(src)
            t0 = lo.astype(np.int64)
            t1 = np.minimum(t0 + 1, side - 1)
            w0 = np.maximum(np.float32(1) - np.abs(src - lo), 0).astype(np.float32)
            w1 = np.maximum(np.float32(1) - np.abs(src - lo - np.float32(1)), 0).astype(np.float32)
            return (np.minimum(t0, side - 1), t1), (w0, w1)

        (r0, r1), (wr0, wr1) = taps(rows, h)
        (c0, c1), (wc0, wc1) = taps(cols, w)
        pe = table[r0 * side + c0] * (wr0 * wc0)[:, None]
        pe += table[r0 * side + c1] * (wr0 * wc1)[:, None]
        pe += table[r1 * side + c0] * (wr1 * wc0)[:, None]
        pe += table[r1 * side + c1] * (wr1 * wc1)[:, None]
        return pe.astype(np.float32)

    # ---- cost ---------------------------------------------------------------------------------

    def flops(self, grids) -> dict:
        """Floating-point operations (2 per multiply-add) of one forward over these grids:
        'gemm' = weight matrix products, 'attn' = score and value products."""
        c = self.cfg
        vd, vi, m = c.hidden_size, c.intermediate_size, c.spatial_merge_size**2
        n = sum(t * h * w for t, h, w in grids)
        patch_dim = self.w.patch_w.shape[1]
        gemm = 2 * n * patch_dim * vd
        gemm += c.depth * 2 * n * (3 * vd * vd + vd * vd + 2 * vd * vi)
        merged = n // m
        gemm += (
            (1 + len(c.deepstack_visual_indexes))
            * 2
            * merged
            * ((m * vd) ** 2 + m * vd * c.out_hidden_size)
        )
        attn = c.depth * sum(t * 4 * (h * w) ** 2 * vd for t, h, w in grids)
        return {"gemm": gemm, "attn": attn, "total": gemm + attn}

    # ---- forward -----------------------------------------------------------------------------

    def forward(self, pixel_values: np.ndarray, grids, cancel=None, progress=None) -> VisionOutput:
        """pixel_values: [N, C*T*P*P] f32 (images concatenated, reference patch order);
        grids: [(t, h, w)] per image. Returns merged embeddings and DeepStack features.
        cancel: an Event checked between blocks (EncodeCancelled); progress(done, depth).
        Small encodes run on this thread alone (SERIAL_ENCODE_MACS); the output is the same
        bits either way."""
        serial = len(pixel_values) * self._weights_per_patch < SERIAL_ENCODE_MACS
        try:
            with one_thread() if serial else contextlib.nullcontext():
                return self._forward(pixel_values, grids, {}, cancel, progress)
        finally:
            for w in self.w.stored:  # the file pages are read again at the next image
                w.release()

    def _forward(
        self, pixel_values: np.ndarray, grids, scratch: dict, cancel=None, progress=None
    ) -> VisionOutput:
        c = self.cfg
        t_start = time.perf_counter()
        perf = time.perf_counter
        timer = VisionTimer()
        grids = [tuple(int(v) for v in g) for g in grids]
        m2 = c.spatial_merge_size**2
        n = sum(t * h * w for t, h, w in grids)
        x_in = np.ascontiguousarray(pixel_values, dtype=np.float32)
        if x_in.shape != (n, self.w.patch_w.shape[1]):
            raise ValueError(
                f"pixel_values {x_in.shape} do not match grids {grids} "
                f"(expected [{n}, {self.w.patch_w.shape[1]}])"
            )
        vd, nh, hd = c.hidden_size, c.num_heads, c.head_dim

        # patch embed + position embeddings, rope tables; spans of each frame (attention unit)
        t0 = perf()
        x = np.matmul(x_in, self.w.patch_w.T)
        timer.gemm += perf() - t0
        add_bias(x, self.w.patch_b)
        cos = np.empty((n, hd // 2), np.float32)
        sin = np.empty_like(cos)
        spans = []
        s0 = 0
        for t, h, w in grids:
            pe, cs, sn = self._grid_tables(h, w)
            for _ in range(t):
                x[s0 : s0 + h * w] += pe
                cos[s0 : s0 + h * w] = cs
                sin[s0 : s0 + h * w] = sn
                spans.append((s0, s0 + h * w))
                s0 += h * w

        hbuf = np.empty_like(x)
        qkv = np.empty((n, 3 * vd), np.float32)
        q = np.empty((nh, n, hd), np.float32)
        k = np.empty_like(q)
        v = np.empty_like(q)
        attn = np.empty((n, vd), np.float32)
        proj = np.empty_like(x)
        mlp_rows = min(n, MLP_CHUNK_ROWS)
        act = np.empty((mlp_rows, c.intermediate_size), np.float32)
        deepstack = []
        if progress is not None:
            progress(0, c.depth)
        for i, b in enumerate(self.w.blocks):
            if cancel is not None and cancel.is_set():
                raise EncodeCancelled
            self._layernorm(x, b.norm1_w, b.norm1_b, hbuf)
            t0 = perf()
            self._mm(hbuf, b.qkv_w, "qkv", scratch, qkv)
            timer.gemm += perf() - t0
            self._split_heads_rope(qkv, b.qkv_b, cos, sin, q, k, v)
            t0 = perf()
            self._attention(q, k, v, spans, attn)
            t1 = perf()
            self._mm(attn, b.proj_w, "proj", scratch, proj)
            timer.attn += t1 - t0
            timer.gemm += perf() - t1
            self._add_bias_residual(x, proj, b.proj_b)
            self._layernorm(x, b.norm2_w, b.norm2_b, hbuf)
            fc1 = self._ready(b.fc1_w, "fc1", scratch)
            fc2 = self._ready(b.fc2_w, "fc2", scratch)
            for r0 in range(0, n, mlp_rows):
                r1 = min(n, r0 + mlp_rows)
                a = act[: r1 - r0]
                t0 = perf()
                self._apply(fc1, hbuf[r0:r1], a)
                timer.gemm += perf() - t0
                self._gelu(a, b.fc1_b)
                t0 = perf()
                self._apply(fc2, a, proj[r0:r1])
                timer.gemm += perf() - t0
            self._add_bias_residual(x, proj, b.fc2_b)
            if i in c.deepstack_visual_indexes:
                j = c.deepstack_visual_indexes.index(i)
                deepstack.append(self._merge(x, self.w.deepstack[j], True, timer, scratch))
            if progress is not None:
                progress(i + 1, c.depth)
        embeds = self._merge(x, self.w.merger, False, timer, scratch)
        counts = [t * h * w // m2 for t, h, w in grids]
        ms = (time.perf_counter() - t_start) * 1e3
        return VisionOutput(
            embeds=embeds,
            deepstack=deepstack,
            counts=counts,
            ms=ms,
            gemm_ms=timer.gemm * 1e3,
            attn_ms=timer.attn * 1e3,
            flops=self.flops(grids),
        )

    def _merge(
        self, x: np.ndarray, mw: MergerWeights, postshuffle: bool, timer, scratch
    ) -> np.ndarray:
        """2x2 patch merger: [N, VD] -> [N/4, out]. Main merger: LayerNorm per token then
        shuffle; DeepStack mergers: shuffle then LayerNorm over 4*VD."""
        m2 = self.cfg.spatial_merge_size**2
        n, vd = x.shape
        if postshuffle:
            g = x.reshape(n // m2, m2 * vd)
            h = np.empty_like(g)
            self._layernorm(g, mw.norm_w, mw.norm_b, h)
        else:
            h = np.empty_like(x)
            self._layernorm(x, mw.norm_w, mw.norm_b, h)
            h = h.reshape(n // m2, m2 * vd)
        t0 = time.perf_counter()
        a = self._mm(h, mw.fc1_w, "merge_fc1", scratch)
        timer.gemm += time.perf_counter() - t0
        bias_gelu_erf(a, mw.fc1_b)
        t0 = time.perf_counter()
        out = self._mm(a, mw.fc2_w, "merge_fc2", scratch)
        timer.gemm += time.perf_counter() - t0
        add_bias(out, mw.fc2_b)
        return out

    # the element-wise kernels of a block, by rows (_by_rows)
    def _gelu(self, a: np.ndarray, bias: np.ndarray) -> None:
        """a = gelu_tanh(a + bias) in place."""
        self._by_rows(len(a), lambda r0, r1: bias_gelu_tanh(a[r0:r1], bias, POW2))

    def _layernorm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        self._by_rows(len(x), lambda r0, r1: layernorm(x[r0:r1], w, b, LN_EPS, out[r0:r1]))

    def _add_bias_residual(self, x: np.ndarray, y: np.ndarray, b: np.ndarray) -> None:
        """x += y + b in place."""
        self._by_rows(len(x), lambda r0, r1: add_bias_residual(x[r0:r1], y[r0:r1], b))

    def _split_heads_rope(self, qkv, bias, cos, sin, q, k, v) -> None:
        def rows(r0, r1):
            split_heads_rope(qkv, bias, cos, sin, q, k, v, r0, r1)

        self._by_rows(len(qkv), rows)

    def _by_rows(self, n: int, run) -> None:
        """run(r0, r1) over row ranges covering 0..n. The q8 encoder splits them over the
        kernel threads: it has no BLAS call between its products whose spinning OpenMP threads
        another parallel region would slow down (engine/vision/kernels.py), and its element-wise
        kernels are a fifth of a 448x448 encode (tanh-GELU alone, 2048 x 4096 values: 5.4-6.6
        ms on one thread, 3.1 ms on two). The f32 one keeps one call on one thread. Each row
        is computed the same either way."""
        import numba

        threads = numba.get_num_threads()
        if self.weights_format != "q8" or threads < 2 or n < 2 * threads:
            run(0, n)
            return
        step = -(-n // threads)
        pool = thread_pool(threads)
        for f in [pool.submit(run, r0, min(n, r0 + step)) for r0 in range(0, n, step)]:
            f.result()

    def _attention(self, q, k, v, spans, out) -> None:
        """Bidirectional attention inside each span; q, k, v: [H, S, HD]; out: [S, H*HD]
        (engine/vision/attention.py): f32 BLAS products with the f32 weights, the fused int8
        kernel with the q8 weights."""
        if self.weights_format == "q8":
            attention_int8(q, k, v, spans, self.scale, out)
            return
        import numba

        attention(q, k, v, spans, self.scale, out, numba.get_num_threads())
