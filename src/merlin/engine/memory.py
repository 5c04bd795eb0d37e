"""How much memory a checkpoint needs in the chosen formats, estimated before loading, and the
guard that refuses a load that would not fit.

The estimate is computed from config.json and the tensor shapes in the safetensors headers (no
tensor data is read), in bytes:

    text weights    every decoder matrix in the weights format (f32, q8_0, q4_0; a matrix whose
                    input size is not a multiple of 32 stays f32), the embedding and lm_head in
                    the head format (engine.text.HEAD_FORMAT), norms in f32
    vision weights  the vision encoder's vectors, patch embedding and position table in f32
                    (when the checkpoint has a usable one); its block and merger matrices stay
                    in the mapped file and are widened to f32 one block at a time while an
                    image is encoded (counted in the buffers)
    KV cache        context x bytes per token (f32, or q8 with one f32 scale per row): the
                    context budget bounds it, the cache never grows past it
    buffers         the larger of a prefill over the whole context (activations of one forward)
                    plus the image rows it carries, and the vision encoder on the largest image
                    that fits the context; at least the load-time conversion chunks
    margin          JIT compilation and allocator slack

The guard compares the total with what the system says is available (MemAvailable in
/proc/meminfo, lowered by a cgroup memory limit when one is set); MERLIN_AVAILABLE_MEMORY
(bytes) overrides it, for tests and for people who want a different cap.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .checkpoint import Checkpoint
from .config import ModelConfig, load_config
from .errors import InputError, MerlinError, ResourceError
from .formats import WEIGHT_CHOICES
from .kernels.kv_layout import KEY_BLOCK, key_tiles
from .kv_cache import KV_FORMATS
from .linear import WEIGHT_FORMATS, quantizable
from .moe import memory as moe_memory
from .quant import BLOCK
from .text import HEAD_FORMAT, check_text_tensors

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 8192  # the app's default context budget (tokens)
MARGIN = 256 * 1024**2
LOAD_CHUNK_BYTES = 64 * 1024**2  # conversion chunks while loading (engine.text.CHUNK_WEIGHTS)
ENV_AVAILABLE = "MERLIN_AVAILABLE_MEMORY"


def matrix_bytes(out_features: int, in_features: int, fmt: str) -> int:
    """Bytes of one [out, in] weight matrix held in `fmt`."""
    n = out_features * in_features
    if fmt == "f32" or not quantizable(in_features):
        return 4 * n
    scales = out_features * (in_features // BLOCK) * 2  # bf16 scale per 32-weight block
    return (n if fmt == "q8" else n // 2) + scales


def text_weight_bytes(cfg: ModelConfig, fmt: str) -> int:
    """All text weights, a mixture-of-experts model's routers and experts included."""
    t = cfg.text
    d, head = t.hidden_size, HEAD_FORMAT[fmt]
    layer = (
        matrix_bytes(t.q_size + 2 * t.kv_size, d, fmt)
        + matrix_bytes(d, t.q_size, fmt)
        + 4 * (2 * d + 2 * t.head_dim)
    )
    mlp = matrix_bytes(2 * t.intermediate_size, d, fmt) + matrix_bytes(d, t.intermediate_size, fmt)
    dense_layers = t.num_hidden_layers - moe_memory.routed_layers(cfg)
    embed = matrix_bytes(t.vocab_size, d, head)
    lm_head = 0 if cfg.tie_word_embeddings else embed
    routed = moe_memory.routed_weight_bytes(cfg, fmt)
    return t.num_hidden_layers * layer + dense_layers * mlp + routed + embed + lm_head + 4 * d


def decode_bytes_per_token(cfg: ModelConfig, fmt: str) -> int:
    """Weight bytes one decode step reads in `fmt`: every layer matrix and norm and the
    lm_head; of an untied embedding only one row."""
    t = cfg.text
    held = text_weight_bytes(cfg, fmt)
    held += moe_memory.routed_bytes_per_token(cfg, fmt) - moe_memory.routed_weight_bytes(cfg, fmt)
    if cfg.tie_word_embeddings:
        return held
    embed = matrix_bytes(t.vocab_size, t.hidden_size, HEAD_FORMAT[fmt])
    return held - embed + matrix_bytes(1, t.hidden_size, HEAD_FORMAT[fmt])


def kv_bytes_per_token(cfg: ModelConfig, kv: str) -> int:
    """As KVCache.bytes_per_token: K and V rows of every layer and KV head."""
    t = cfg.text
    per_row = t.head_dim * 4 if kv == "f32" else t.head_dim + 4
    return 2 * t.num_hidden_layers * t.num_key_value_heads * per_row


def prefill_bytes_per_row(cfg: ModelConfig) -> int:
    """Activations TextModel.forward holds per prompt row (x, h, proj, qkv, attn, the q/k
    buffers, gate_up, act), in float32."""
    t = cfg.text
    d, q, kv, i = t.hidden_size, t.q_size, t.kv_size, t.intermediate_size
    return 4 * (3 * d + 3 * q + 3 * kv + 3 * i) + moe_memory.routed_bytes_per_row(cfg)


def vision_weight_bytes(cfg: ModelConfig) -> int:
    """The vision weights held in memory: all but the block and merger matrices in f32 (those
    stay in the checkpoint file, engine.vision.encoder.StoredWeight), plus the block and
    merger matrices' q8 copies (34 bytes a block of 32: engine/vision/qweights.py, the default
    vision weights format), made at the first image for those whose input width is a
    multiple of 32 (the others are widened from the file at each encode)."""
    from .vision.weights import expected_vision_tensors, is_stored_matrix

    if cfg.vision is None:
        return 0
    shapes = expected_vision_tensors(cfg.vision)
    f32 = 4 * sum(math.prod(s) for name, s in shapes.items() if not is_stored_matrix(name))
    q8_weights = [s for name, s in shapes.items() if is_stored_matrix(name) and quantizable(s[1])]
    q8 = sum(math.prod(s) for s in q8_weights) * 34 // 32
    return f32 + q8


def vision_widen_bytes(cfg: ModelConfig) -> int:
    """The f32 scratch an encoder run widens the stored matrices into: one block's four
    matrices and one merger's two."""
    v = cfg.vision
    vd, vi, m = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size**2
    # f32 scratch plus the stored-dtype scratch pread() fills (vision/stored.py): at most 4
    # more bytes per element (F32 is read straight into the f32 buffer; BF16/F16 take 2)
    return 8 * (4 * vd * vd + 2 * vi * vd + m * m + v.out_hidden_size * m)


def vision_buffer_bytes(cfg: ModelConfig, patches: int) -> tuple[int, int]:
    """(peak bytes of one encoder run over `patches` patches, bytes of its outputs that stay
    alive through the text prefill)."""
    from .vision.encoder import ATTN_CHUNK_ELEMS, MLP_CHUNK_ROWS

    v = cfg.vision
    if v is None or patches <= 0:
        return 0, 0
    m2 = v.spatial_merge_size**2
    tokens = patches // m2
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
    per_patch = 4 * (10 * v.hidden_size + patch_dim + v.hidden_size // v.num_heads)
    outputs = 4 * tokens * v.out_hidden_size * (1 + len(v.deepstack_visual_indexes))
    merger = 4 * tokens * m2 * v.hidden_size * 2
    from .threads import default_threads

    # the attention's score chunks: one per thread (engine/vision/attention.py)
    attn = ATTN_CHUNK_ELEMS * default_threads()
    chunks = 4 * (min(patches, MLP_CHUNK_ROWS) * v.intermediate_size + attn)
    widen = vision_widen_bytes(cfg)
    return patches * per_patch + outputs + merger + chunks + widen, outputs


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a loaded model needs, by part (see the module docstring)."""

    weights_fmt: str
    kv_fmt: str
    context: int
    image_pixels: int
    text_weights: int
    vision_weights: int
    kv_cache: int
    buffers: int
    margin: int
    kv_bytes_per_token: int
    mapped_experts: int = 0  # expert bytes left in the mapped weight cache (not in total)

    @property
    def total(self) -> int:
        return self.text_weights + self.vision_weights + self.kv_cache + self.buffers + self.margin

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}

    def describe(self) -> str:
        parts = [f"weights {gb(self.text_weights)} ({self.weights_fmt})"]
        if self.mapped_experts:
            parts.append(
                f"experts {gb(self.mapped_experts)} memory-mapped from the weight cache "
                "(read from disk as needed, one layer's worth counted in the buffers)"
            )
        if self.vision_weights:
            parts.append(f"vision encoder {gb(self.vision_weights)}")
        parts.append(f"KV cache {gb(self.kv_cache)} ({self.kv_fmt}, {self.context} tokens)")
        parts.append(f"working buffers {gb(self.buffers + self.margin)}")
        return f"about {gb(self.total)}: " + ", ".join(parts)


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def check_formats(weights: str, kv: str) -> str:
    """The concrete weights format ("auto" resolved: engine/autoweights.py), after checking."""
    if weights == "auto":
        from .autoweights import resolve

        weights = resolve(weights)
    if weights not in WEIGHT_FORMATS:
        raise InputError(
            f"unknown weights format {weights!r}; choose one of {', '.join(WEIGHT_CHOICES)}."
        )
    if kv not in KV_FORMATS:
        raise InputError(f"unknown KV cache format {kv!r}; choose one of {', '.join(KV_FORMATS)}.")
    return weights


def _image_patches(cfg: ModelConfig, folder: Path, context: int, image_pixels: int | None):
    """(pixels, patches) of the largest image a prompt can carry: the pixel budget, and no more
    image tokens than the context holds."""
    from .vision.preprocess import load_preprocess_config

    v = cfg.vision
    if v is None:
        return 0, 0
    if image_pixels is None:
        try:
            image_pixels = load_preprocess_config(folder).max_pixels
        except MerlinError:  # the model loads without images then (engine.vision.model)
            return 0, 0
    per_patch = v.patch_size**2
    patches = min(image_pixels // per_patch, context * v.spatial_merge_size**2)
    return image_pixels, patches


def estimate_for(
    cfg: ModelConfig,
    folder: Path,
    weights: str,
    kv: str,
    context: int | None = None,
    image_pixels: int | None = None,
    vision_usable: bool = True,
    map_experts: bool = False,
) -> MemoryEstimate:
    """The estimate from a parsed config whose tensor shapes have been checked. map_experts:
    a mixture-of-experts model's experts stay in the memory-mapped weight cache (only one
    layer of them counted as resident); quantized formats only (f32 is not cached)."""
    weights = check_formats(weights, kv)
    limit = cfg.text.max_position_embeddings
    context = min(context or min(DEFAULT_CONTEXT, limit), limit)
    if context < 1:
        raise InputError(f"the context budget must be at least 1 token, got {context}.")
    per_token = kv_bytes_per_token(cfg, kv)
    kv_cache = key_tiles(context) * KEY_BLOCK * per_token  # K is stored in tiles of 64 tokens
    pixels, patches = (
        _image_patches(cfg, folder, context, image_pixels) if vision_usable else (0, 0)
    )
    vision_peak, image_rows = vision_buffer_bytes(cfg, patches)
    prefill = context * prefill_bytes_per_row(cfg) + 4 * cfg.text.vocab_size
    mapped = moe_memory.all_expert_bytes(cfg, weights) if map_experts and weights != "f32" else 0
    resident = moe_memory.layer_expert_bytes(cfg, weights) if mapped else 0
    return MemoryEstimate(
        weights_fmt=weights,
        kv_fmt=kv,
        context=context,
        image_pixels=pixels,
        text_weights=text_weight_bytes(cfg, weights) - mapped,
        vision_weights=vision_weight_bytes(cfg) if vision_usable else 0,
        kv_cache=kv_cache,
        buffers=max(prefill + image_rows, vision_peak, LOAD_CHUNK_BYTES) + resident,
        margin=MARGIN,
        kv_bytes_per_token=per_token,
        mapped_experts=mapped,
    )


def vision_usable(ckpt: Checkpoint, cfg: ModelConfig) -> bool:
    from .vision.weights import vision_tensor_problem

    return cfg.vision is not None and vision_tensor_problem(ckpt, cfg.vision) is None


def estimate_memory(
    folder: Path | str,
    weights: str = "f32",
    kv: str = "f32",
    context: int | None = None,
    image_pixels: int | None = None,
) -> MemoryEstimate:
    """Memory the checkpoint in `folder` needs loaded as `weights` with a `kv` cache for
    `context` tokens (default: DEFAULT_CONTEXT, at most the model's maximum) and images of up
    to `image_pixels` pixels (default: the checkpoint's preprocessor max_pixels). Reads only
    config.json and the safetensors headers; raises CheckpointError for a broken checkpoint."""
    weights = check_formats(weights, kv)
    folder = Path(os.path.expanduser(folder))
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt:
        check_text_tensors(ckpt, cfg)
        usable = vision_usable(ckpt, cfg)
    return estimate_for(cfg, folder, weights, kv, context, image_pixels, usable)


# ---- the guard ---------------------------------------------------------------------------------


def _meminfo_available() -> int | None:
    return _meminfo("MemAvailable")


def _cgroup_available() -> int | None:
    """Room left under a cgroup v2 memory limit (containers), or None without one."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        current = int((base / "memory.current").read_text().strip())
        return max(0, int(limit) - current)
    except (OSError, ValueError):
        return None


def _meminfo(field: str) -> int | None:
    """A /proc/meminfo field in bytes (e.g. "MemTotal"), or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def total_memory() -> int | None:
    """Bytes of RAM this process may use in all: the machine's (MemTotal, else sysconf),
    lowered by a cgroup v2 limit (containers); None when the system does not say."""
    found = [_meminfo("MemTotal")]
    if found[0] is None:
        try:
            found = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
        except (AttributeError, OSError, ValueError):
            found = []
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit))
    except (OSError, ValueError):
        pass
    found = [n for n in found if n]
    return min(found) if found else None


def resident_memory() -> int:
    """Resident memory (RSS) of this process in bytes (Linux: /proc/self/statm; elsewhere
    the peak from getrusage, the closest the system says)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def available_memory() -> int | None:
    """Bytes of memory this process can still use, or None when the system does not say."""
    override = os.environ.get(ENV_AVAILABLE)
    if override:
        try:
            return int(float(override))
        except ValueError:
            log.warning("%s=%r is not a number of bytes; ignored", ENV_AVAILABLE, override)
    found = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return min(found) if found else None


def _alternatives(est: MemoryEstimate, fits) -> str:
    """A sentence naming the first smaller settings that would fit, or ''. Tried in order of
    what they cost in quality: a q8 KV cache, q8 then q4 weights, then a smaller context."""
    cur = (est.weights_fmt, est.kv_fmt, est.context)
    candidates = []
    for c in (est.context, 4096, 2048):
        for w, k in (
            (est.weights_fmt, est.kv_fmt),
            (est.weights_fmt, "q8"),
            ("q8", est.kv_fmt),
            ("q8", "q8"),
            ("q4", "q8"),
        ):
            if c <= est.context and (w, k, c) != cur and (w, k, c) not in candidates:
                candidates.append((w, k, c))
    for w, k, c in candidates:
        if fits(w, k, c):
            changes = []
            if w != est.weights_fmt:
                changes.append(f"{w} weights")
            if k != est.kv_fmt:
                changes.append(f"a {k} KV cache")
            if c != est.context:
                changes.append(f"a context budget of {c} tokens")
            return f" It would fit with {' and '.join(changes)}."
    return ""


def check_memory(
    est: MemoryEstimate,
    name: str,
    available: int | None = None,
    alternative=None,
) -> None:
    """Raise ResourceError when `est` does not fit in `available` bytes (default:
    available_memory(); None from the system means no check). alternative(w, kv, context) ->
    MemoryEstimate lets the message suggest settings that would fit."""
    if available is None:
        available = available_memory()
    if available is None or est.total <= available:
        return
    hint = ""
    if alternative is not None:
        hint = _alternatives(est, lambda w, k, c: alternative(w, k, c).total <= available)
    raise ResourceError(
        f"{name} needs {est.describe()}, but only {gb(available)} of memory is available."
        f"{hint} Close other programs or choose smaller settings (weights format, KV cache "
        "format, context budget, image detail)."
    )


def check_kv_cache(cfg: ModelConfig, kv: str, tokens: int, available: int | None = None) -> None:
    """Raise ResourceError before allocating a KV cache of `tokens` tokens that does not fit
    in the memory available now (the load-time guard checked the default context only; a
    budget of the model's maximum can be far larger)."""
    need = key_tiles(max(int(tokens), 1)) * KEY_BLOCK * kv_bytes_per_token(cfg, kv)
    if available is None:
        available = available_memory()
    if available is None or need <= available:
        return
    per_gb = max(1, int(1e9 // max(1, kv_bytes_per_token(cfg, kv))))
    raise ResourceError(
        f"a context of {tokens:,} tokens needs a {gb(need)} KV cache ({kv}), but only "
        f"{gb(available)} of memory is available. Lower the context budget (--max-context, or "
        f"the setting; about {per_gb:,} tokens per GB) or use a q8 KV cache."
    )
