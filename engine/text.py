"""Qwen3-VL text decoder: one forward over N new tokens at given 3D positions.

The same entry point serves prefill (N large), decode (N = 1) and speculative verify
(N = K + 1). Image embeddings replace rows at image-pad positions and DeepStack features are
added after the first decoder layers, so the vision encoder plugs in without changes here.
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
from .kernels.rope import apply_rope
from .kv_cache import KVCache
from .linear import make_linear
from .profile import StepTimer
from .rope import MRope

PREFIX = "model.language_model."


@dataclass
class LayerWeights:
    input_norm: np.ndarray  # [D]
    qkv: object  # Linear [NH*HD + 2*NKV*HD, D]
    o: object  # Linear [D, NH*HD]
    q_norm: np.ndarray  # [HD]
    k_norm: np.ndarray  # [HD]
    post_norm: np.ndarray  # [D]
    gate_up: object  # Linear [2*I, D]
    down: object  # Linear [D, I]


@dataclass
class TextWeights:
    embed: np.ndarray  # [V, D] f32 lookup table
    layers: list[LayerWeights]
    norm: np.ndarray  # [D]
    lm_head: object  # Linear [V, D]

    def matrices(self):
        for layer in self.layers:
            yield from (layer.qkv, layer.o, layer.gate_up, layer.down)
        yield self.lm_head

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
        return sum(m.nbytes for m in self.matrices()) + norms + self.embed[0].nbytes


def expected_text_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape for every text tensor, the one place that knows the names."""
    t = cfg.text
    d, hd = t.hidden_size, t.head_dim
    names = {PREFIX + "embed_tokens.weight": (t.vocab_size, d), PREFIX + "norm.weight": (d,)}
    for i in range(t.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
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
                p + "mlp.gate_proj.weight": (t.intermediate_size, d),
                p + "mlp.up_proj.weight": (t.intermediate_size, d),
                p + "mlp.down_proj.weight": (d, t.intermediate_size),
            }
        )
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (t.vocab_size, d)
    return names


def check_text_tensors(ckpt: Checkpoint, cfg: ModelConfig) -> None:
    """Fail before loading anything if a text tensor is missing or has the wrong shape."""
    for name, shape in expected_text_tensors(cfg).items():
        if name not in ckpt:
            hint = ""
            if name == "lm_head.weight":
                hint = " (config.json says tie_word_embeddings is false)"
            raise CheckpointError(f"{ckpt.folder}: tensor {name!r} is missing{hint}.")
        info = ckpt.info(name)
        if info.shape != shape:
            raise CheckpointError(
                f"{info.file}: tensor {name!r} has shape {list(info.shape)} but config.json "
                f"implies {list(shape)}. The config does not match the weights."
            )


def load_text_weights(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    fmt: str = "f32",
    progress: Callable[[float, str], None] | None = None,
) -> TextWeights:
    """Read tensor by tensor (peak memory: the final weights plus one layer in flight)."""
    check_text_tensors(ckpt, cfg)
    t = cfg.text

    def get(name):
        return ckpt.read_f32(name)

    layers = []
    for i in range(t.num_hidden_layers):
        if progress:
            progress(i / (t.num_hidden_layers + 1), f"reading layer {i + 1}/{t.num_hidden_layers}")
        p = f"{PREFIX}layers.{i}."
        qkv = np.concatenate([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        gate_up = np.concatenate([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        layers.append(
            LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=make_linear(qkv, fmt),
                o=make_linear(get(p + "self_attn.o_proj.weight"), fmt),
                q_norm=get(p + "self_attn.q_norm.weight"),
                k_norm=get(p + "self_attn.k_norm.weight"),
                post_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=make_linear(gate_up, fmt),
                down=make_linear(get(p + "mlp.down_proj.weight"), fmt),
            )
        )
        del qkv, gate_up
    if progress:
        progress(t.num_hidden_layers / (t.num_hidden_layers + 1), "reading embeddings")
    embed = get(PREFIX + "embed_tokens.weight")
    head = embed if cfg.tie_word_embeddings else get("lm_head.weight")
    return TextWeights(
        embed=embed, layers=layers, norm=get(PREFIX + "norm.weight"), lm_head=make_linear(head, fmt)
    )


class TextModel:
    def __init__(self, cfg: TextConfig, weights: TextWeights):
        self.cfg = cfg
        self.w = weights
        self.rope = MRope(cfg)
        self.scale = np.float32(cfg.head_dim**-0.5)

    def new_cache(self, max_tokens: int, fmt: str = "f32") -> KVCache:
        c = self.cfg
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, max_tokens, fmt)

    def forward(
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
        """Run N new tokens, append their K/V to the cache and return logits.

        ids: [N] int; positions: [3, N] int (t, h, w); embeds: [M, D] f32 rows that replace
        the token embeddings at row indexes embed_rows [M] (image tokens); deepstack: list of
        [M, D] f32 added to those rows after layers 0, 1, ...; logits: "last" -> [1, V],
        "all" -> [N, V], "none" -> None.
        """
        c = self.cfg
        timer = timer or StepTimer()
        n = len(ids)
        start = cache.length
        cache.reserve(start + n)
        x = self.w.embed[np.asarray(ids)]  # [N, D] (a copy)
        if embeds is not None:
            x[embed_rows] = embeds
        cos, sin = self.rope.cos_sin(positions)
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = np.empty_like(x)  # [N, D]
        qkv = np.empty((n, c.q_size + 2 * c.kv_size), np.float32)
        attn = np.empty((n, c.q_size), np.float32)
        gate_up = np.empty((n, 2 * c.intermediate_size), np.float32)
        act = np.empty((n, c.intermediate_size), np.float32)
        proj = np.empty_like(x)
        perf = time.perf_counter
        for li, lw in enumerate(self.w.layers):
            rmsnorm(x, lw.input_norm, c.rms_norm_eps, h)
            t0 = perf()
            lw.qkv(h, qkv)
            timer.gemm += perf() - t0
            q = qkv[:, : c.q_size].reshape(n * nh, hd).copy()
            k = qkv[:, c.q_size : c.q_size + c.kv_size].reshape(n * nkv, hd).copy()
            rmsnorm(q, lw.q_norm, c.rms_norm_eps, q)
            rmsnorm(k, lw.k_norm, c.rms_norm_eps, k)
            q = q.reshape(n, nh, hd)
            k = k.reshape(n, nkv, hd)
            apply_rope(q, cos, sin)
            apply_rope(k, cos, sin)
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
