"""Typed view of a Qwen3-VL `config.json`, validated with messages a user can act on.

Two spellings exist: the published checkpoints (transformers 4.57: `rope_theta` and
`rope_scaling` inside text_config, vision model_type "qwen3_vl") and what transformers 5.x
writes (`rope_parameters`). Both load into the same dataclasses.

Three model types: qwen3_vl (dense), qwen3_vl_moe (the same layout with routed experts,
engine.moe.config) and qwen3_moe (text only: the text keys at the top level, tensors under
`model.` instead of `model.language_model.`, plain RoPE, which is M-RoPE with the three
position components equal, so any section adding up to head_dim/2 computes it).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckpointError
from .moe.config import MoEConfig, parse_moe

SUPPORTED_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_moe")
TEXT_PREFIX = {"qwen3_moe": "model."}  # others: "model.language_model."
# Layer and block counts drive loops over tensor names before any tensor is read; Qwen3-VL has
# at most a few dozen, so anything above this is a damaged config, refused at once.
MAX_LAYERS = 1024
# config.json, generation_config.json, the shard index: real ones are at most a few MB
MAX_JSON_BYTES = 64 << 20
MAX_HEAD_DIM = 1024
# What transformers takes when config.json leaves a key out (so a config it runs computes the
# same here): Qwen3VLTextConfig.head_dim (the MoE configs take hidden / heads) and
# Qwen3VLVisionConfig.deepstack_visual_indexes.
DENSE_HEAD_DIM = 128
DEFAULT_DEEPSTACK = (8, 16, 24)


@dataclass(frozen=True)
class TextConfig:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    mrope_section: tuple[int, int, int]
    mrope_interleaved: bool
    rms_norm_eps: float
    hidden_act: str = "silu"
    attention_bias: bool = False
    moe: MoEConfig | None = None  # routed experts (engine.moe); None: every MLP dense

    def is_moe_layer(self, i: int) -> bool:
        return self.moe is not None and self.moe.is_moe_layer(i)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def n_params(self) -> int:
        """Decoder parameters without the embedding (lm_head counted separately)."""
        return self._decoder_params(active=False)

    @property
    def n_active_params(self) -> int:
        """As n_params, counting of each routed layer only the experts one token runs."""
        return self._decoder_params(active=True)

    def _decoder_params(self, active: bool) -> int:
        d, i = self.hidden_size, self.intermediate_size
        attn = d * self.q_size * 2 + d * self.kv_size * 2
        total = d
        for li in range(self.num_hidden_layers):
            mlp = 3 * d * i
            if self.is_moe_layer(li):
                m = self.moe
                n = m.experts_per_token if active else m.num_experts
                mlp = n * 3 * d * m.moe_intermediate_size + m.num_experts * d
            total += attn + mlp + 2 * d + 2 * self.head_dim
        return total


# vision_config.hidden_act values the encoder computes: gelu in its tanh form (two names of
# one formula in transformers: GELUTanh, NewGELU)
VISION_ACTS = ("gelu_pytorch_tanh", "gelu_new")


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0  # vision 2D RoPE; 5.x writes rope_parameters.rope_theta

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    text: TextConfig
    vision: VisionConfig | None
    tie_word_embeddings: bool
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    identity: str = field(default="", compare=False)
    text_prefix: str = "model.language_model."  # where the decoder's tensors are named

    @property
    def is_moe(self) -> bool:
        return self.text.moe is not None

    def describe(self) -> str:
        t = self.text
        mlp = f"mlp {t.intermediate_size}"
        if t.moe is not None:
            m = t.moe
            mlp = (
                f"{m.num_experts} experts x {m.moe_intermediate_size}, "
                f"{m.experts_per_token} per token"
            )
        return (
            f"{self.model_type}: {t.num_hidden_layers} layers, hidden {t.hidden_size}, "
            f"heads {t.num_attention_heads}/{t.num_key_value_heads} x {t.head_dim}, "
            f"{mlp}, vocab {t.vocab_size}, "
            f"{'tied' if self.tie_word_embeddings else 'untied'} lm_head"
        )


def _need(d: dict, key: str, kind, where: str, path: Path):
    if key not in d:
        raise CheckpointError(f"{path}: '{where}{key}' is missing. Is this a Qwen3-VL checkpoint?")
    value = d[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise CheckpointError(f"{path}: '{where}{key}' must be an integer, got {value!r}.")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise CheckpointError(f"{path}: '{where}{key}' must be a number, got {value!r}.")
    if kind is int and value <= 0 and key not in ("image_token_id",):
        raise CheckpointError(f"{path}: '{where}{key}' must be positive, got {value}.")
    return kind(value)


def _opt_int(d: dict, key: str, default: int, where: str, path: Path) -> int:
    """An optional positive integer field (the default when absent)."""
    return _need({key: d.get(key, default)}, key, int, where, path)


def _max_positions(text: dict, path: Path) -> int:
    """max_position_embeddings, refused above engine.limits.MAX_CONTEXT_TOKENS: it is the
    default context budget, and a KV cache is sized from it."""
    from .limits import MAX_CONTEXT_TOKENS

    n = _opt_int(text, "max_position_embeddings", 262144, "text_config.", path)
    if n > MAX_CONTEXT_TOKENS:
        raise CheckpointError(
            f"{path}: 'text_config.max_position_embeddings' is {n:,}; Merlin supports at most "
            f"{MAX_CONTEXT_TOKENS:,} positions (Qwen3-VL has 262,144). The config is damaged."
        )
    return n


def _rope(text: dict, path: Path) -> tuple[float, tuple[int, int, int], bool]:
    """rope_theta/mrope_section from either spelling (4.57 rope_scaling or 5.x rope_parameters)."""
    params = text.get("rope_parameters")
    scaling = text.get("rope_scaling")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{path}: 'text_config.rope_parameters' must be an object.")
    if scaling is not None and not isinstance(scaling, dict):
        raise CheckpointError(f"{path}: 'text_config.rope_scaling' must be an object.")
    merged = {**(scaling or {}), **(params or {})}
    theta = merged.get("rope_theta", text.get("rope_theta"))
    if theta is None:
        raise CheckpointError(
            f"{path}: no rope_theta found (neither text_config.rope_theta nor "
            "text_config.rope_parameters.rope_theta)."
        )
    if (
        isinstance(theta, bool)
        or not isinstance(theta, (int, float))
        or not math.isfinite(theta)
        or theta <= 1
    ):
        raise CheckpointError(f"{path}: rope_theta must be a number > 1, got {theta!r}.")
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise CheckpointError(
            f"{path}: rope_type '{rope_type}' is not supported (Qwen3-VL uses 'default')."
        )
    section = merged.get("mrope_section", [24, 20, 20])
    if (
        not isinstance(section, list)
        or len(section) != 3
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)
    ):
        raise CheckpointError(f"{path}: mrope_section must be three integers, got {section!r}.")
    return float(theta), tuple(section), bool(merged.get("mrope_interleaved", True))


def parse_config(raw: dict, path: Path) -> ModelConfig:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object at the top level.")
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not supported. Merlin runs Qwen3-VL "
            "checkpoints (model_type 'qwen3_vl', e.g. Qwen/Qwen3-VL-2B-Instruct; 'qwen3_vl_moe', "
            "Qwen3-VL-30B-A3B) and Qwen3-30B-A3B (model_type 'qwen3_moe')."
        )
    quantized = raw.get("quantization_config")
    if quantized is not None:  # its tensors are FP8, AWQ, GPTQ...: not weights Merlin reads
        method = quantized.get("quant_method") if isinstance(quantized, dict) else None
        raise CheckpointError(
            f"{path}: this checkpoint was quantized by another tool"
            f"{f' ({method})' if isinstance(method, str) else ''}; Merlin reads the original "
            "BF16 (or F16/F32) weights and quantizes them itself (--weights q8 or q4). Use the "
            "model's BF16 release instead (e.g. Qwen/Qwen3-VL-2B-Instruct, not ...-FP8)."
        )
    flat = model_type == "qwen3_moe"  # text keys at the top level, no vision
    text = raw if flat else raw.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{path}: 'text_config' is missing or not an object.")
    w = "" if flat else "text_config."
    if flat and text.get("use_sliding_window", False):
        raise CheckpointError(f"{path}: use_sliding_window=true is not supported.")
    hidden = _need(text, "hidden_size", int, w, path)
    n_heads = _need(text, "num_attention_heads", int, w, path)
    # absent (or null) means the default; a 0 is a damaged value, not "use the default"
    n_kv = text.get("num_key_value_heads")
    n_kv = n_heads if n_kv is None else n_kv
    if isinstance(n_kv, bool) or not isinstance(n_kv, int) or n_kv <= 0:
        raise CheckpointError(
            f"{path}: 'text_config.num_key_value_heads' must be a positive integer, got {n_kv!r}."
        )
    head_dim = text.get("head_dim")
    if head_dim is None:  # transformers' defaults: Qwen3-VL's dense text config has its own
        head_dim = DENSE_HEAD_DIM if model_type == "qwen3_vl" else hidden // n_heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise CheckpointError(
            f"{path}: 'text_config.head_dim' must be a positive integer, got {head_dim!r}."
        )
    if head_dim > MAX_HEAD_DIM or n_kv > n_heads:
        raise CheckpointError(
            f"{path}: head_dim {head_dim} / num_key_value_heads {n_kv} are not those of a "
            f"Qwen3-VL model (head_dim at most {MAX_HEAD_DIM}, no more KV heads than heads)."
        )
    if n_heads % n_kv:
        raise CheckpointError(
            f"{path}: num_attention_heads ({n_heads}) is not a multiple of "
            f"num_key_value_heads ({n_kv})."
        )
    if head_dim % 2:
        raise CheckpointError(f"{path}: head_dim ({head_dim}) must be even for rotary embeddings.")
    theta, section, interleaved = _rope(text, path)
    rope_keys = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
    if flat and "mrope_section" not in rope_keys:
        section = (head_dim // 2, 0, 0)  # plain RoPE (see the module docstring)
    if sum(section) != head_dim // 2:
        raise CheckpointError(
            f"{path}: mrope_section {list(section)} must add up to head_dim/2 = {head_dim // 2}."
        )
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{path}: text hidden_act {act!r} is not supported (expected silu).")
    if text.get("attention_bias", False):
        raise CheckpointError(f"{path}: attention_bias=true is not supported by Qwen3-VL.")
    eps = text.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{path}: rms_norm_eps must be a small positive number, got {eps!r}.")
    n_layers = _need(text, "num_hidden_layers", int, w, path)
    if n_layers > MAX_LAYERS:
        raise CheckpointError(
            f"{path}: 'text_config.num_hidden_layers' is {n_layers}; no Qwen3-VL model has more "
            f"than {MAX_LAYERS}. The config is damaged."
        )
    text_cfg = TextConfig(
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        intermediate_size=_need(text, "intermediate_size", int, w, path),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        vocab_size=_need(text, "vocab_size", int, w, path),
        max_position_embeddings=_max_positions(text, path),
        rope_theta=theta,
        mrope_section=section,
        mrope_interleaved=interleaved,
        rms_norm_eps=float(eps),
        moe=parse_moe(text, model_type, n_layers, w, path),
    )
    vision = None if flat else _parse_vision(raw.get("vision_config"), path)
    if vision is not None and vision.out_hidden_size != hidden:
        raise CheckpointError(
            f"{path}: vision_config.out_hidden_size ({vision.out_hidden_size}) must equal "
            f"text_config.hidden_size ({hidden})."
        )
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if not isinstance(tie, bool):
        raise CheckpointError(f"{path}: 'tie_word_embeddings' must be true or false, got {tie!r}.")

    def token_id(key: str, default: int) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{path}: '{key}' must be a non-negative integer.")
        return value

    identity = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    return ModelConfig(
        model_type=model_type,
        text=text_cfg,
        vision=vision,
        tie_word_embeddings=bool(tie),
        image_token_id=token_id("image_token_id", 151655),
        video_token_id=token_id("video_token_id", 151656),
        vision_start_token_id=token_id("vision_start_token_id", 151652),
        vision_end_token_id=token_id("vision_end_token_id", 151653),
        identity=identity,
        text_prefix=TEXT_PREFIX.get(model_type, "model.language_model."),
    )


def _parse_vision(vision: dict | None, path: Path) -> VisionConfig | None:
    if vision is None:
        return None
    if not isinstance(vision, dict):
        raise CheckpointError(f"{path}: 'vision_config' must be an object.")
    w = "vision_config."
    depth = _need(vision, "depth", int, w, path)
    if depth > MAX_LAYERS:
        raise CheckpointError(
            f"{path}: 'vision_config.depth' is {depth}; no Qwen3-VL model has more than "
            f"{MAX_LAYERS}. The config is damaged."
        )
    hidden = _need(vision, "hidden_size", int, w, path)
    heads = _need(vision, "num_heads", int, w, path)
    if hidden % heads or (hidden // heads) % 4:
        raise CheckpointError(
            f"{path}: vision hidden_size ({hidden}) / num_heads ({heads}) must be a multiple of 4."
        )
    indexes = vision.get("deepstack_visual_indexes")
    if indexes is None:  # transformers' default; blocks past the depth are never reached
        indexes = [i for i in DEFAULT_DEEPSTACK if i < depth]
    if not isinstance(indexes, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth for i in indexes
    ):
        raise CheckpointError(
            f"{path}: deepstack_visual_indexes must be block indexes below depth {depth}."
        )
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in VISION_ACTS:  # the encoder's blocks compute gelu's tanh form only
        raise CheckpointError(
            f"{path}: vision hidden_act {act!r} is not supported (expected "
            f"{' or '.join(VISION_ACTS)})."
        )
    return VisionConfig(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=_need(vision, "intermediate_size", int, w, path),
        num_heads=heads,
        patch_size=_opt_int(vision, "patch_size", 16, w, path),
        temporal_patch_size=_opt_int(vision, "temporal_patch_size", 2, w, path),
        spatial_merge_size=_opt_int(vision, "spatial_merge_size", 2, w, path),
        in_channels=_opt_int(vision, "in_channels", 3, w, path),
        out_hidden_size=_need(vision, "out_hidden_size", int, w, path),
        num_position_embeddings=_opt_int(vision, "num_position_embeddings", 2304, w, path),
        deepstack_visual_indexes=tuple(indexes),
        hidden_act=act,
        rope_theta=_vision_theta(vision, path),
    )


def _vision_theta(vision: dict, path: Path) -> float:
    params = vision.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    theta = vision.get("rope_theta", 10000.0) if theta is None else theta
    if (
        isinstance(theta, bool)
        or not isinstance(theta, (int, float))
        or not math.isfinite(theta)
        or theta <= 1
    ):
        raise CheckpointError(f"{path}: vision rope_theta must be a number > 1, got {theta!r}.")
    return float(theta)


def read_json(path: Path, what: str) -> dict:
    """Read a JSON object from a checkpoint file with a clear error for each way it can fail."""
    from .safe_open import read_bytes

    try:
        os.lstat(path)  # not lexists: a folder that cannot be read is no missing file
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: {what} is missing. Choose a Hugging Face checkpoint folder."
        ) from None
    except OSError as e:
        raise CheckpointError(
            f"{path}: cannot read {what} ({e.strerror}). Check the folder's permissions."
        ) from None
    try:
        # a FIFO or device is refused with what it is (never opened blocking); real config
        # and index files are well under MAX_JSON_BYTES
        data = json.loads(read_bytes(path, what, CheckpointError, MAX_JSON_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, or a 5000-digit number
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e}).") from None
    except RecursionError:
        raise CheckpointError(f"{path}: {what} is not valid JSON (nested too deeply).") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror}).") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {what} must hold a JSON object.")
    return data


def load_config(folder: Path) -> ModelConfig:
    folder = Path(folder)
    try:
        os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        pass  # said below, with what the path is
    except (OSError, ValueError) as e:  # not allowed in, a name too long, a NUL
        if getattr(e, "errno", None) != errno.ELOOP:  # a loop of links: said below
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise CheckpointError(f"{folder}: cannot be opened ({why}).") from None
    if not folder.is_dir():
        if folder.is_file():
            problem = "is a file, not a folder"
        elif os.path.lexists(folder):
            problem = "cannot be opened as a folder (a broken link or a loop of links)"
        else:
            problem = "no such folder"
        raise CheckpointError(
            f"{folder}: {problem}. Give the folder of a Qwen3-VL checkpoint "
            "(with config.json, model.safetensors and tokenizer.json)."
        )
    path = folder / "config.json"
    return parse_config(read_json(path, "config.json"), path)
