"""Qwen3-VL text decoder: one forward over N new tokens at given 3D positions.

The same entry point serves prefill (N large), decode (N = 1) and speculative verify
(N = K + 1). Image embeddings replace rows at image-pad positions and DeepStack features are
added after the first decoder layers, so the vision encoder plugs in without changes here.

A routed layer of a mixture-of-experts model (cfg.is_moe_layer) has LayerWeights.moe
(engine.moe.weights.ExpertWeights) in place of gate_up / down; its tensor names are the
decoder prefix's (ModelConfig.text_prefix: qwen3_moe names them model.*).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .checkpoint import Checkpoint
from .config import ModelConfig, TextConfig
from .errors import CheckpointError
from .kernels.activation import silu_mul
from .kernels.attention import attention
from .kernels.norm import rmsnorm
from .kernels.rope import norm_rope_heads
from .kv_cache import KVCache
from .linear import F32Linear, quantizable, quantized_linear
from .moe.weights import ExpertWeights, accepted_shapes, expected_expert_tensors, load_experts
from .profile import StepTimer
from .quant import BLOCK, QTensor, quantize
from .rope import MRope
from .threads import one_thread

PREFIX = "model.language_model."
# A forward whose weight bytes a token x rows are under this runs on one kernel thread
# (TextModel.forward): the demo model's decode and verify (1.6 MB a token at q4); any real
# checkpoint (the 2B reads 1.1 GB a token) and long prefills use the pool.
SERIAL_WORK_BYTES = 16 << 20


@dataclass
class LayerWeights:
    input_norm: np.ndarray  # [D]
    qkv: object  # Linear [NH*HD + 2*NKV*HD, D]
    o: object  # Linear [D, NH*HD]
    q_norm: np.ndarray  # [HD]
    k_norm: np.ndarray  # [HD]
    post_norm: np.ndarray  # [D]
    gate_up: object  # Linear [2*I, D] (None in a routed layer)
    down: object  # Linear [D, I] (None in a routed layer)
    moe: ExpertWeights | None = None  # a routed layer's router and experts


@dataclass
class TextWeights:
    embed: object  # Linear [V, D]; .rows(ids) is the lookup
    layers: list[LayerWeights]
    norm: np.ndarray  # [D]
    lm_head: object  # Linear [V, D]

    def matrices(self):
        """Every dense matrix (a routed layer's experts: experts())."""
        for layer in self.layers:
            yield from (m for m in (layer.qkv, layer.o, layer.gate_up, layer.down) if m)
        yield self.lm_head

    def experts(self):
        return [layer.moe for layer in self.layers if layer.moe is not None]

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every matrix once, norms, one embedding row."""
        norms = (
            sum(
                lw.input_norm.nbytes + lw.post_norm.nbytes + lw.q_norm.nbytes + lw.k_norm.nbytes
                for lw in self.layers
            )
            + self.norm.nbytes
        )
        embed_row = self.embed.nbytes // self.embed.out_features
        routed = sum(ew.bytes_per_token for ew in self.experts())
        return sum(m.nbytes for m in self.matrices()) + norms + embed_row + routed


def expected_text_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape for every text tensor, the one place that knows the names."""
    t = cfg.text
    d, hd = t.hidden_size, t.head_dim
    pre = cfg.text_prefix
    names = {pre + "embed_tokens.weight": (t.vocab_size, d), pre + "norm.weight": (d,)}
    for i in range(t.num_hidden_layers):
        p = f"{pre}layers.{i}."
        names.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (t.q_size, d),
                p + "self_attn.k_proj.weight": (t.kv_size, d),
                p + "self_attn.v_proj.weight": (t.kv_size, d),
                p + "self_attn.o_proj.weight": (d, t.q_size),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "post_attention_layernorm.weight": (d,),
            }
        )
        if t.is_moe_layer(i):
            names.update(expected_expert_tensors(cfg, i))
        else:
            names.update(
                {
                    p + "mlp.gate_proj.weight": (t.intermediate_size, d),
                    p + "mlp.up_proj.weight": (t.intermediate_size, d),
                    p + "mlp.down_proj.weight": (d, t.intermediate_size),
                }
            )
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (t.vocab_size, d)
    return names


def check_text_tensors(ckpt: Checkpoint, cfg: ModelConfig) -> None:
    """Fail before loading anything if a text tensor is missing or has the wrong shape or a
    dtype that is not a float."""
    layers = cfg.text.num_hidden_layers
    if f"{cfg.text_prefix}layers.{layers - 1}.input_layernorm.weight" not in ckpt:
        # checked first: listing every expected name of a config that claims 10**12 layers
        # would never finish
        raise CheckpointError(
            f"{ckpt.folder}: config.json says {layers} decoder layers but the weights have no "
            f"layer {layers - 1}. The config does not match the weights."
        )
    if f"{cfg.text_prefix}layers.{layers}.input_layernorm.weight" in ckpt:
        raise CheckpointError(  # the extra layers would be left out without a word
            f"{ckpt.folder}: config.json says {layers} decoder layers but the weights have a "
            f"layer {layers} too. The config does not match the weights."
        )
    for name, shape in expected_text_tensors(cfg).items():
        if name not in ckpt:
            hint = ""
            if name == "lm_head.weight":
                hint = " (config.json says tie_word_embeddings is false)"
            raise CheckpointError(f"{ckpt.folder}: tensor {name!r} is missing{hint}.")
        info = ckpt.float_info(name)
        if info.shape not in accepted_shapes(name, shape):
            raise CheckpointError(
                f"{info.file}: tensor {name!r} has shape {list(info.shape)} but config.json "
                f"implies {list(shape)}. The config does not match the weights."
            )


# Head (and embedding) format per weights format, chosen by measurement (docs/benchmarks.md,
# tests/test_quality.py): under q4 blocks a q8 head costs 16% more bytes per 2B token and
# agreed with f32 on 71.5% instead of 61% of the demo model's tokens; llama.cpp likewise keeps
# a 6-bit head in its 4-bit files.
HEAD_FORMAT = {"f32": "f32", "q8": "q8", "q4": "q8"}
# Weight formats whose q8 head takes int8 activations (the q4 blocks' own; as llama.cpp's
# Q8_0 x Q8_0) instead of q8's int16: half the dot instructions, which a verify of 5 tokens
# is bound by (qgroup.matmul_q8a8g).
HEAD_INT8_ACTIVATIONS = {"q4"}
MLP_IN = ("mlp.gate_proj.weight", "mlp.up_proj.weight")  # a dense MLP's gate_up rows
CHUNK_WEIGHTS = 1 << 22  # rows are converted in chunks of about this many weights


def build_matrix(ckpt: Checkpoint, names: list[str], fmt: str, int8_activations: bool = False):
    """The rows of `names` stacked into one matrix in `fmt`, converted chunk by chunk so that
    no full f32 copy of a large tensor (or of the fused matrix) ever exists. A matrix whose
    input size is not a multiple of the 32-weight block stays f32."""
    shapes = [ckpt.info(n).shape for n in names]
    k = shapes[0][1]
    n_out = sum(s[0] for s in shapes)
    step = max(1, CHUNK_WEIGHTS // k)
    if fmt == "f32" or not quantizable(k):
        w = np.empty((n_out, k), np.float32)
        o = 0
        for name, (rows, _) in zip(names, shapes):
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                w[o + r0 : o + r1] = ckpt.read_f32_rows(name, r0, r1)
            ckpt.release(name)
            o += rows
        return F32Linear(w)
    qs = np.empty((n_out, k if fmt == "q8" else k // 2), np.int8 if fmt == "q8" else np.uint8)
    scales = np.empty((n_out, k // BLOCK), np.uint16)
    o = 0
    for name, (rows, _) in zip(names, shapes):
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            qt = quantize(ckpt.read_f32_rows(name, r0, r1), fmt)
            qs[o + r0 : o + r1] = qt.qs
            scales[o + r0 : o + r1] = qt.scales
        ckpt.release(name)
        o += rows
    return quantized_linear(QTensor(fmt, qs, scales), int8_activations)


def _experts(ckpt, cfg, i, fmt, sink):
    experts = load_experts(ckpt, cfg, i, fmt)
    return sink(i, experts) if sink is not None else experts


def load_text_weights(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    fmt: str = "f32",
    progress: Callable[[float, str], None] | None = None,
    experts_sink: Callable | None = None,
) -> TextWeights:
    """Read and convert tensor by tensor: peak memory stays near the final weights.
    experts_sink(i, experts) -> experts sees each routed layer as it is converted (the
    weight cache writes it and may hand back memory-mapped views: engine.moe.cache)."""
    check_text_tensors(ckpt, cfg)
    t = cfg.text
    head_fmt = HEAD_FORMAT[fmt]
    verb = "reading" if fmt == "f32" else "quantizing"

    def vec(name):
        return ckpt.read_f32(name)

    pre = cfg.text_prefix
    layers = []
    for i in range(t.num_hidden_layers):
        if progress:
            progress(i / (t.num_hidden_layers + 1), f"{verb} layer {i + 1}/{t.num_hidden_layers}")
        p = f"{pre}layers.{i}."
        routed = t.is_moe_layer(i)
        layers.append(
            LayerWeights(
                input_norm=vec(p + "input_layernorm.weight"),
                qkv=build_matrix(ckpt, [p + f"self_attn.{n}_proj.weight" for n in "qkv"], fmt),
                o=build_matrix(ckpt, [p + "self_attn.o_proj.weight"], fmt),
                q_norm=vec(p + "self_attn.q_norm.weight"),
                k_norm=vec(p + "self_attn.k_norm.weight"),
                post_norm=vec(p + "post_attention_layernorm.weight"),
                gate_up=None if routed else build_matrix(ckpt, [p + n for n in MLP_IN], fmt),
                down=None if routed else build_matrix(ckpt, [p + "mlp.down_proj.weight"], fmt),
                moe=_experts(ckpt, cfg, i, fmt, experts_sink) if routed else None,
            )
        )
    if progress:
        progress(t.num_hidden_layers / (t.num_hidden_layers + 1), f"{verb} embeddings")
    int8 = fmt in HEAD_INT8_ACTIVATIONS
    embed = build_matrix(ckpt, [pre + "embed_tokens.weight"], head_fmt, int8)
    head = (
        embed if cfg.tie_word_embeddings else build_matrix(ckpt, ["lm_head.weight"], head_fmt, int8)
    )
    return TextWeights(embed=embed, layers=layers, norm=vec(pre + "norm.weight"), lm_head=head)


class TextModel:
    def __init__(self, cfg: TextConfig, weights: TextWeights):
        self.cfg = cfg
        self.w = weights
        self.rope = MRope(cfg)
        self.scale = np.float32(cfg.head_dim**-0.5)
        # called with (layer, idx [N, k], weights [N, k]) after each routed layer (tests)
        self.on_routing: Callable | None = None
        # forwards of this many rows or more use the kernel pool (forward); computed once:
        # bytes_per_token walks every matrix
        self._pool_rows = -(-SERIAL_WORK_BYTES // max(1, weights.bytes_per_token))

    @property
    def experts_read(self) -> int:
        """Experts the last forward read, over all routed layers (0 for a dense model)."""
        return sum(ew.last_used for ew in self.w.experts())

    @property
    def last_weight_bytes(self) -> int:
        """Weight bytes the last forward read: a routed layer's router and the experts its
        rows chose (their union: a verify of K + 1 rows reads each chosen expert once)."""
        routed = self.w.experts()
        per_token = sum(ew.bytes_per_token for ew in routed)
        used = sum(ew.router.nbytes + ew.last_used * ew.expert_bytes for ew in routed)
        return self.w.bytes_per_token - per_token + used

    def new_cache(self, max_tokens: int, fmt: str = "f32") -> KVCache:
        c = self.cfg
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, max_tokens, fmt)

    def forward(self, ids: np.ndarray, positions: np.ndarray, cache: KVCache, **kw):
        """Run N new tokens, append their K/V to the cache and return logits.

        ids: [N] int; positions: [3, N] int (t, h, w); embeds: [M, D] f32 rows that replace
        the token embeddings at row indexes embed_rows [M] (image tokens); deepstack: list of
        [M, D] f32 added to those rows after layers 0, 1, ...; logits: "last" -> [1, V],
        "all" -> [N, V], "none" -> None; timer: a StepTimer to fill.

        A forward whose weight work (bytes a token x N) is under SERIAL_WORK_BYTES runs its
        kernels on this thread alone: waking the pool for each of its small products cost
        more than it saved (the tiny demo model decoded 3,000 tokens/s on one thread and
        130-140 on two while other work shared the cores). Rows are the same either way (the
        kernels' results do not depend on the thread count)."""
        if len(ids) >= self._pool_rows:
            return self._forward(ids, positions, cache, **kw)
        with one_thread():
            return self._forward(ids, positions, cache, **kw)

    def _forward(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        cache: KVCache,
        *,
        embeds: np.ndarray | None = None,
        embed_rows: np.ndarray | None = None,
        deepstack: list[np.ndarray] | None = None,
        logits: str = "last",
        timer: StepTimer | None = None,
    ) -> np.ndarray | None:
        c = self.cfg
        timer = timer or StepTimer()
        n = len(ids)
        start = cache.length
        cache.reserve(start + n)
        x = self.w.embed.rows(np.asarray(ids))  # [N, D] f32 (a copy)
        if embeds is not None:
            x[embed_rows] = embeds
        cos, sin = self.rope.cos_sin(positions)
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = np.empty_like(x)  # [N, D]
        qkv = np.empty((n, c.q_size + 2 * c.kv_size), np.float32)
        q = np.empty((n, nh, hd), np.float32)
        k = np.empty((n, nkv, hd), np.float32)
        attn = np.empty((n, c.q_size), np.float32)
        dense = any(lw.moe is None for lw in self.w.layers)
        inter = c.intermediate_size if dense else 0
        gate_up = np.empty((n, 2 * inter), np.float32)
        act = np.empty((n, inter), np.float32)
        proj = np.empty_like(x)
        perf = time.perf_counter
        for li, lw in enumerate(self.w.layers):
            rmsnorm(x, lw.input_norm, c.rms_norm_eps, h)
            t0 = perf()
            lw.qkv(h, qkv)
            timer.gemm += perf() - t0
            norm_rope_heads(qkv, 0, lw.q_norm, c.rms_norm_eps, cos, sin, q)
            norm_rope_heads(qkv, c.q_size, lw.k_norm, c.rms_norm_eps, cos, sin, k)
            cache.write(li, start, k, qkv[:, c.q_size + c.kv_size :].reshape(n, nkv, hd))
            t0 = perf()
            attention(q, *cache.layer(li), start, self.scale, attn)
            t1 = perf()
            lw.o(attn, proj)
            timer.attn += t1 - t0
            timer.gemm += perf() - t1
            x += proj
            rmsnorm(x, lw.post_norm, c.rms_norm_eps, h)
            t0 = perf()
            if lw.moe is not None:
                routing = lw.moe(h, proj)
                if self.on_routing is not None:
                    self.on_routing(li, *routing)
            else:
                lw.gate_up(h, gate_up)
                timer.gemm += perf() - t0
                silu_mul(gate_up, act)
                t0 = perf()
                lw.down(act, proj)
            timer.gemm += perf() - t0
            x += proj
            if deepstack is not None and li < len(deepstack):
                x[embed_rows] += deepstack[li]
        cache.length = start + n
        if logits == "none":
            return None
        if logits == "last":
            x = x[-1:]
        rmsnorm(x, self.w.norm, c.rms_norm_eps, x)
        out = np.empty((x.shape[0], c.vocab_size), np.float32)
        t0 = perf()
        self.w.lm_head(np.ascontiguousarray(x), out)
        timer.gemm += perf() - t0
        return out
