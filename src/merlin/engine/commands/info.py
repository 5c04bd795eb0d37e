"""merlin-cli info: architecture, sizes, bytes per token, CPUs and memory of a checkpoint."""

from __future__ import annotations

import json
import os

import numpy as np

from ..formats import KV_FORMATS, WEIGHT_FORMATS
from .args import add_model_args, model_dir


def register(sub) -> None:
    p = sub.add_parser("info", help="architecture, sizes and bytes per token of a checkpoint")
    add_model_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)


def _thinking_info(folder) -> dict:
    """What the chat template says about a thinking block (engine.thinking.support)."""
    from dataclasses import asdict

    from ..errors import TokenizerError
    from ..thinking import support
    from ..tokenizer import Tokenizer

    try:
        return asdict(support(Tokenizer.from_folder(folder)))
    except TokenizerError as e:
        return {"supported": False, "switchable": False, "opens": False, "reason": str(e)}


def cmd_info(args) -> int:
    from .. import memory
    from ..autoweights import kernel_info
    from ..checkpoint import Checkpoint
    from ..config import load_config
    from ..moe.memory import describe_experts
    from ..text import expected_text_tensors

    memory.check_formats(args.weights, args.kv)  # an unknown name: an error before any output
    folder = model_dir(args.model)
    cfg = load_config(folder)
    t = cfg.text
    kernels = kernel_info(args.weights)
    args.weights = kernels["weights"]
    with Checkpoint(folder) as ckpt:
        dtypes = sorted({ckpt.info(n).dtype for n in ckpt.tensors})
        n_total = sum(int(np.prod(i.shape)) for i in ckpt.tensors.values())
    text_tensors = expected_text_tensors(cfg)
    matrices = sum(int(np.prod(s)) for s in text_tensors.values() if len(s) >= 2)
    vectors = sum(int(np.prod(s)) for s in text_tensors.values() if len(s) == 1)
    per_token = {w: memory.decode_bytes_per_token(cfg, w) for w in WEIGHT_FORMATS}
    kv_per_token = {kv: memory.kv_bytes_per_token(cfg, kv) for kv in KV_FORMATS}
    info = {
        "folder": str(folder),
        "architecture": cfg.describe(),
        "model_type": cfg.model_type,
        "layers": t.num_hidden_layers,
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "heads": t.num_attention_heads,
        "kv_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "vocab_size": t.vocab_size,
        "rope_theta": t.rope_theta,
        "mrope_section": list(t.mrope_section),
        "tied_lm_head": cfg.tie_word_embeddings,
        "vision": None
        if cfg.vision is None
        else {
            "depth": cfg.vision.depth,
            "hidden_size": cfg.vision.hidden_size,
            "deepstack_visual_indexes": list(cfg.vision.deepstack_visual_indexes),
        },
        "checkpoint_dtypes": dtypes,
        "params_total": n_total,
        "params_text": matrices + vectors,
        "weight_bytes_per_token": per_token,
        "kv_bytes_per_token": kv_per_token,
        "moe": describe_experts(cfg),
        "cpus": _cpu_info(args),
        "kernels": kernels,
        "memory": _memory_info(folder),
        "thinking": _thinking_info(folder),
    }
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"model:        {folder}")
    print(f"architecture: {info['architecture']}")
    print(f"rope:         theta {t.rope_theta:g}, mrope_section {list(t.mrope_section)}")
    if cfg.vision:
        v = cfg.vision
        print(
            f"vision:       {v.depth} blocks, hidden {v.hidden_size}, {v.num_heads} heads, "
            f"deepstack {list(v.deepstack_visual_indexes)}"
        )
    print(f"parameters:   {n_total:,} total, {matrices + vectors:,} text decoder")
    if info["moe"]:
        moe = info["moe"]
        print(
            f"experts:      {moe['experts']} per layer in {moe['routed_layers']} layers, "
            f"{moe['experts_per_token']} per token: {moe['params_decoder_active']:,} active of "
            f"{moe['params_decoder_total']:,} decoder parameters per token"
        )
    print(f"stored as:    {', '.join(dtypes)}")
    th = info["thinking"]
    print(
        "thinking:     "
        + (
            f"no ({th['reason']})"
            if not th["supported"]
            else "yes, "
            + ("can be switched off" if th["switchable"] else "always (the prompt opens it)")
        )
    )
    print(f"cpu:          {info['cpus']['topology']}")
    print(f"threads:      {info['cpus']['placement']}")
    print(f"kernels:      {kernels['cpu_class_description']}")
    print(f"weights:      {kernels['weights']} ({kernels['weights_reason']})")
    chosen = f"{args.weights} weights, {args.kv} KV"
    print(
        f"read/token:   {per_token[args.weights] / 1e6:,.1f} MB of {args.weights} weights "
        f"+ {kv_per_token[args.kv] / 1e3:,.1f} KB of {args.kv} KV per context token (chosen)"
    )
    others = ", ".join(f"{w} {b / 1e6:,.1f} MB" for w, b in per_token.items() if w != args.weights)
    kv_others = ", ".join(f"{k} {b / 1e3:,.1f} KB" for k, b in kv_per_token.items() if k != args.kv)
    print(f"              other formats: weights {others}; KV {kv_others}")
    mem = info["memory"]
    avail = f"{mem['available'] / 1e9:.1f} GB" if mem["available"] else "unknown"
    print(f"memory:       needs, with a context of {mem['context']} tokens ({avail} available):")
    for name, est in mem["estimates"].items():
        mark = "  (chosen)" if name == chosen else ""
        print(f"  {name + ':':22}{est['total'] / 1e9:5.1f} GB{mark}")
    return 0


def _memory_info(folder) -> dict:
    """What loading needs per weights/KV format at the default context (engine.memory)."""
    from ..memory import available_memory, estimate_memory

    estimates = {
        f"{w} weights, {kv} KV": estimate_memory(folder, w, kv).to_dict()
        for w in ("f32", "q8", "q4")
        for kv in ("f32", "q8")
    }
    context = next(iter(estimates.values()))["context"]
    return {"context": context, "available": available_memory(), "estimates": estimates}


def _cpu_info(args) -> dict:
    """What thread placement chose here (engine.cpu), for `info`."""
    from ..cpu import choose

    placement = choose(args.cpus or os.environ.get("MERLIN_CPUS") or "big", args.threads)
    return {
        "topology": placement.topology.describe(),
        "source": placement.topology.source,
        "big_cores": list(placement.topology.big_cores()),
        "cpus": list(placement.cpus),
        "threads": placement.threads,
        "placement": placement.describe(),
    }
