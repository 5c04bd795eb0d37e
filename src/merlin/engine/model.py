"""Load a Qwen3-VL checkpoint folder: config, tokenizer, generation defaults, text decoder."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import memory, weight_cache
from .checkpoint import Checkpoint
from .config import ModelConfig, load_config, read_json
from .errors import CheckpointError, InputError, ResourceError
from .kv_cache import KVCache
from .moe.cache import ExpertSink
from .sampling import SamplingParams
from .text import TextModel, check_text_tensors, load_text_weights
from .tokenizer import Tokenizer
from .vision.model import VisionModel, load_vision


@dataclass
class GenerationDefaults:
    eos_ids: frozenset[int]
    sampling: SamplingParams


@dataclass
class Model:
    folder: Path
    config: ModelConfig
    tokenizer: Tokenizer
    text: TextModel
    defaults: GenerationDefaults
    weights_fmt: str
    load_s: float
    kv_fmt: str = "f32"
    vision: VisionModel | None = None  # images; vision.require() raises why not if unusable
    memory: memory.MemoryEstimate | None = None  # what the guard estimated at load time
    experts_mapped: bool = False  # experts are views of the mapped weight cache (engine.moe)

    def new_cache(self, max_tokens: int | None = None) -> KVCache:
        """An empty KV cache in this model's KV format (max_tokens: the context budget; None:
        default_context). ResourceError when the cache would not fit in the memory available
        now."""
        n = min(max_tokens or self.default_context, self.max_context)
        memory.check_kv_cache(self.config, self.kv_fmt, n)
        return self.text.new_cache(n, self.kv_fmt)

    @property
    def name(self) -> str:
        """What the checkpoint is called: its Hugging Face repository ("Qwen/Qwen3-VL-2B-
        Instruct") when it is a snapshot in the hub's cache (whose folder is a commit hash),
        else its folder's name, the path resolved first ("." has none)."""
        folder = Path(self.folder).resolve()
        repo = folder.parent.parent.name
        if folder.parent.name == "snapshots" and repo.startswith("models--"):
            return repo[len("models--") :].replace("--", "/")
        return folder.name or str(folder)

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.defaults.eos_ids

    @property
    def max_context(self) -> int:
        return self.config.text.max_position_embeddings

    @property
    def default_context(self) -> int:
        """The context budget when none is given: memory.DEFAULT_CONTEXT (what the load-time
        memory guard and `merlin-cli info` count), at most the model's maximum (a cache for
        Qwen3-VL's 262,144 positions would hold 15 GB of q8 KV for the 2B)."""
        return min(memory.DEFAULT_CONTEXT, self.max_context)

    @property
    def bytes_per_token(self) -> int:
        return self.text.w.bytes_per_token


def read_generation_defaults(folder: Path, tokenizer: Tokenizer) -> GenerationDefaults:
    """generation_config.json when present; otherwise stop on <|im_end|> / <|endoftext|>."""
    path = Path(folder) / "generation_config.json"
    raw = read_json(path, "generation_config.json") if path.exists() else {}
    eos = raw.get("eos_token_id")

    def is_id(e) -> bool:
        return isinstance(e, int) and not isinstance(e, bool)

    if eos == []:  # as if there were none: the chat's own end tokens
        eos = None
    if is_id(eos) or (isinstance(eos, list) and all(is_id(e) for e in eos)):
        eos_ids = set(eos) if isinstance(eos, list) else {eos}
        outside = sorted(e for e in eos_ids if not 0 <= e < tokenizer.vocab_size)
        if outside:  # the model could never stop
            raise CheckpointError(
                f"{path}: eos_token_id {outside[0]} is not a token of the tokenizer (ids 0 to "
                f"{tokenizer.vocab_size - 1}). Fix the value or remove the file."
            )
    elif eos is None:
        eos_ids = {
            tokenizer.special_tokens[t]
            for t in ("<|im_end|>", "<|endoftext|>")
            if t in tokenizer.special_tokens
        }
    else:
        raise CheckpointError(f"{path}: eos_token_id must be an integer or a list of integers.")
    if not eos_ids:
        raise CheckpointError(
            f"{folder}: no end-of-sequence token is known (no eos_token_id in "
            "generation_config.json and no <|im_end|> in the tokenizer)."
        )
    greedy = raw.get("do_sample") is False

    def num(key, default, kind=float):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return default
        try:
            return kind(value)
        except (OverflowError, ValueError):  # int(inf), int(nan)
            return default

    sampling = SamplingParams(
        temperature=0.0 if greedy else num("temperature", 0.7),
        top_k=num("top_k", 20, int),
        top_p=num("top_p", 0.8),
        min_p=num("min_p", 0.0),
        repetition_penalty=num("repetition_penalty", 1.0),
    )
    try:
        sampling.validate()
    except InputError:
        sampling = SamplingParams()
    return GenerationDefaults(frozenset(eos_ids), sampling)


def load_model(
    folder: Path | str,
    weights: str = "f32",
    kv: str = "f32",
    progress: Callable[[float, str], None] | None = None,
    *,
    context: int | None = None,
    check_memory: bool = True,
    map_experts: bool | None = None,
    vision_weights: str | None = None,
) -> Model:
    """Load everything needed to chat. Raises CheckpointError/TokenizerError with a message,
    and ResourceError before converting anything when the model would not fit in the memory
    available (engine.memory: weights in this format + KV for `context` tokens, default
    memory.DEFAULT_CONTEXT, + working buffers).

    map_experts (mixture-of-experts models, quantized weights): keep the experts in the
    memory-mapped weight cache instead of anonymous memory; None (default) maps them only
    when the model does not fit in memory otherwise but does with them mapped. weights "auto":
    engine/autoweights.py."""
    weights = memory.check_formats(weights, kv)
    t0 = time.perf_counter()
    folder = Path(os.path.expanduser(folder))
    config = load_config(folder)
    tokenizer = Tokenizer.from_folder(folder)
    if tokenizer.vocab_size > config.text.vocab_size:
        raise CheckpointError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {config.text.vocab_size}; tokenizer and weights do not belong together."
        )
    defaults = read_generation_defaults(folder, tokenizer)
    with Checkpoint(folder) as ckpt:
        check_text_tensors(ckpt, config)
        usable = memory.vision_usable(ckpt, config)

        def estimate(w, k, c, mapped=False):
            return memory.estimate_for(
                config, folder, w, k, c, vision_usable=usable, map_experts=mapped
            )

        mappable = config.is_moe and weights != "f32" and map_experts is not False
        if map_experts and config.is_moe and weights == "f32":
            raise InputError(
                "experts are mapped from the weight cache, which holds quantized weights only: "
                "choose q4 or q8 weights, or do not ask to map the experts."
            )
        available = memory.available_memory() if check_memory else None

        def best(w, k, c):  # in memory when it fits, else with the experts mapped
            est = estimate(w, k, c, mapped=bool(map_experts) and mappable)
            if map_experts is None and mappable and available and est.total > available:
                est = estimate(w, k, c, mapped=True)
            return est

        needs = best(weights, kv, context)
        mapped = needs.mapped_experts > 0
        if check_memory:
            memory.check_memory(needs, folder.name, available=available, alternative=best)
        # quantized weights are cached on disk (f32 would be 4x the checkpoint: not cached)
        key = weight_cache.cache_key(ckpt, config, weights) if weights != "f32" else None
        weights_ = weight_cache.load(key, config, map_experts=mapped) if key else None
        if weights_ is None and key:
            cached = needs.text_weights + needs.mapped_experts
            if not weight_cache.has_room(cached):
                if mapped:  # the experts were to be read from the cache's file
                    raise ResourceError(
                        f"{folder.name} fits in memory only with its experts mapped from the "
                        f"weight cache, and its disk has not {cached / 1e9:.1f} GB free "
                        f"({weight_cache.cache_dir()}). Free some space there or set "
                        "MERLIN_WEIGHT_CACHE to a folder on a larger disk."
                    )
                key = None
        if weights_ is None:
            sink = None
            if key and config.is_moe:  # experts written (and mapped) layer by layer
                sink = ExpertSink(weight_cache.cache_dir(), key, config, mapped)
            weights_ = load_text_weights(ckpt, config, weights, progress, experts_sink=sink)
            if key:
                if progress:
                    progress(0.95, "saving the converted weights for the next start")
                if weight_cache.store(key, weights_):
                    # this session too runs on the cache's huge-page copy (weight_cache):
                    # the converted arrays are let go first, so memory never holds both
                    weights_ = None
                    weights_ = weight_cache.load(key, config, map_experts=mapped)
                if weights_ is None:  # the file just written did not read back: convert again
                    weights_ = load_text_weights(ckpt, config, weights, progress, experts_sink=sink)
        if progress:
            progress(0.97, "reading the vision encoder")
        vision = load_vision(folder, ckpt, config)
        vision.set_weights_format(vision_weights)  # None: q8 where it can (engine/vision)
    if progress:
        progress(1.0, "ready")
    return Model(
        folder=folder,
        config=config,
        tokenizer=tokenizer,
        text=TextModel(config.text, weights_),
        defaults=defaults,
        weights_fmt=weights,
        load_s=time.perf_counter() - t0,
        kv_fmt=kv,
        vision=vision,
        memory=needs,
        experts_mapped=mapped,
    )
