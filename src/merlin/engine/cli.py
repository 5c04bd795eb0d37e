"""merlin-cli: headless use of the engine (info, generate, chat, logits).

The flags are used by checks outside the test suite; keep them stable. Every error a user can
cause ends in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from .errors import MerlinError
from .formats import DEFAULT_KV, DEFAULT_WEIGHTS, KV_FORMATS, WEIGHT_FORMATS
from .speculative import MAX_K, SPEC_MODES, SpecPolicy

EXIT_USER_ERROR = 2


def _model_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg).expanduser()
    from .demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint()


def _load(args):
    from .cpu import place
    from .model import load_model

    place(getattr(args, "cpus", None), args.threads)
    return load_model(
        _model_dir(args.model),
        weights=args.weights,
        kv=args.kv,
        vision_weights=getattr(args, "vision_weights", None),
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint folder (default: the built-in demo checkpoint)")
    p.add_argument(
        "--weights",
        default=DEFAULT_WEIGHTS,
        help=f"weight format: f32, q8 or q4 (default {DEFAULT_WEIGHTS})",
    )
    p.add_argument(
        "--kv", default=DEFAULT_KV, help=f"KV cache format: f32 or q8 (default {DEFAULT_KV})"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="kernel threads (default: one per CPU used)"
    )
    p.add_argument(
        "--cpus",
        default=None,
        metavar="big|all|LIST",
        help="CPUs to run on: big (big cores of a big.LITTLE CPU; the default), all, or 0-3,6",
    )


def _add_image_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="attach an image (repeatable; images go before the text, in this order)",
    )
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="pixel budget per image: fewer pixels = fewer image tokens = faster "
        "(used when --image-tokens is not given)",
    )
    p.add_argument(
        "--image-tokens",
        type=int,
        default=None,
        metavar="N",
        help="image-token budget per image: fewer tokens = faster, more = more detail "
        "(default: this machine's, e.g. 1024 on a desktop, 256 on a board; docs/vision.md)",
    )
    p.add_argument(
        "--vision-weights",
        choices=("f32", "q8"),
        default=None,
        help="vision encoder matrices: q8 (integer kernels, the default where the shapes "
        "allow) or f32 (BLAS, the reference)",
    )


def _prompt(args, model):
    """The prompt (ids, 3D positions, rope delta) with the --image files prepared."""
    from .prompt import build_prompt

    images = []
    if args.image:
        from .vision import budget

        model.vision.require()
        pre = model.vision.preprocess
        asked = getattr(args, "max_context", None)
        context = min(asked or model.max_context, model.max_context)
        if args.image_tokens is not None:  # the user's number: within the context too
            budget.check_budget(args.image_tokens, pre, context)
        max_px, _ = budget.resolve(pre, None, args.image_tokens, args.max_pixels, context)
        for path in args.image:
            image = model.vision.prepare(path, max_px)
            budget.check_image_fits(image.n_tokens, context, pre, str(path))  # before encoding
            images.append(image)
    return build_prompt(model.tokenizer, model.config, args.prompt, images, system=args.system)


def cmd_info(args) -> int:
    from . import memory
    from .checkpoint import Checkpoint
    from .config import load_config
    from .text import expected_text_tensors

    folder = _model_dir(args.model)
    cfg = load_config(folder)
    t = cfg.text
    with Checkpoint(folder) as ckpt:
        dtypes = sorted({ckpt.info(n).dtype for n in ckpt.tensors})
        n_total = sum(int(np.prod(i.shape)) for i in ckpt.tensors.values())
    text_tensors = expected_text_tensors(cfg)
    matrices = sum(int(np.prod(s)) for s in text_tensors.values() if len(s) == 2)
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
        "cpus": _cpu_info(args),
        "memory": _memory_info(folder),
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
    print(f"stored as:    {', '.join(dtypes)}")
    print(f"cpu:          {info['cpus']['topology']}")
    print(f"threads:      {info['cpus']['placement']}")
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
    from .memory import available_memory, estimate_memory

    estimates = {
        f"{w} weights, {kv} KV": estimate_memory(folder, w, kv).to_dict()
        for w in ("f32", "q8", "q4")
        for kv in ("f32", "q8")
    }
    context = next(iter(estimates.values()))["context"]
    return {"context": context, "available": available_memory(), "estimates": estimates}


def _cpu_info(args) -> dict:
    """What thread placement chose here (engine.cpu), for `info`."""
    from .cpu import choose

    placement = choose(args.cpus or os.environ.get("MERLIN_CPUS") or "big", args.threads)
    return {
        "topology": placement.topology.describe(),
        "source": placement.topology.source,
        "big_cores": list(placement.topology.big_cores()),
        "cpus": list(placement.cpus),
        "threads": placement.threads,
        "placement": placement.describe(),
    }


def cmd_warmup(args) -> int:
    from .warmup import run

    return run(args)


def _sampling(args, model):
    from dataclasses import replace

    base = model.defaults.sampling
    overrides = {
        k: v
        for k, v in {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "min_p": args.min_p,
            "repetition_penalty": args.repetition_penalty,
            "seed": args.seed,
        }.items()
        if v is not None
    }
    return replace(base, **overrides).validate()


def format_profile(p) -> str:
    """One readable line per forward: the headless twin of the app's performance panel."""
    line = (
        f"step {p.step:4d}  rows {p.n_tokens:4d}  emitted {p.emitted}  ctx {p.context:5d}  "
        f"gemm {p.gemm_ms:7.2f}  attn {p.attn_ms:6.2f}  other {p.other_ms:6.2f}  "
        f"total {p.total_ms:7.2f} ms  {p.gb_per_s:5.1f} GB/s"
    )
    if p.spec:
        line += "  " + " ".join(f"{k}={v}" for k, v in p.spec.items())
    return line


def cmd_generate(args) -> int:
    from .generate import Finished, GenerationRequest, Tokens, event_json, generate

    model = _load(args)
    prompt = _prompt(args, model)
    request = GenerationRequest(
        prompt_ids=prompt.ids,
        sampling=_sampling(args, model),
        max_new_tokens=args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        spec=args.spec,
        spec_k=args.spec_k,
        positions=prompt.positions,
        rope_delta=prompt.rope_delta,
        images=prompt.images,
    )
    out = sys.stdout
    _, notice = SpecPolicy.or_off(args.spec, args.spec_k)
    if notice:
        print(f"merlin-cli: warning: {notice}", file=sys.stderr)
    for event in generate(model, request, max_context=args.max_context):
        if args.profile and isinstance(event, Tokens) and event.ids:
            print(format_profile(event.profile), file=sys.stderr)
        if args.json:
            obj = event_json(event)
            out.write(json.dumps(obj, ensure_ascii=False) + "\n")
            out.flush()
        elif isinstance(event, Tokens):
            out.write(event.text)
            out.flush()
        elif isinstance(event, Finished):
            out.write("\n")
            t = event.totals
            vision = f"vision {t['vision_ms']:.0f} ms, " if t.get("vision_ms") else ""
            print(
                f"[{event.reason}: {t['generated_tokens']} tokens, {vision}"
                f"prefill {t['prefill_ms']:.0f} ms, {t['tokens_per_s']:.1f} tok/s]",
                file=sys.stderr,
            )
    return 0


def cmd_logits(args) -> int:
    from .generate import check_prompt

    model = _load(args)
    built = _prompt(args, model)
    prompt = built.ids
    check_prompt(model, prompt, model.max_context)
    image_kw = {}
    if built.images:
        inputs = model.vision.prompt_inputs(prompt, built.images)
        image_kw = dict(embeds=inputs.embeds, embed_rows=inputs.rows, deepstack=inputs.deepstack)
    cache = model.new_cache(len(prompt))
    logits = model.text.forward(
        np.asarray(prompt), built.positions, cache, logits="all", **image_kw
    )
    out = Path(args.out)
    try:
        np.save(out, logits.astype(np.float32))
    except OSError as e:
        raise MerlinError(f"{out}: cannot write ({e.strerror}).") from None
    print(f"saved logits {logits.shape} for {len(prompt)} prompt tokens to {out}", file=sys.stderr)
    return 0


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    """The options of `generate`, shared by `chat`."""
    p.add_argument("--system", default=None, help="system prompt")
    _add_image_args(p)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-context", type=int, default=None, help="context budget in tokens")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--ignore-eos", action="store_true", help="generate eos tokens like any other token"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per event per line")
    p.add_argument(
        "--spec",
        default="auto",
        help=f"speculative decoding: {'|'.join(SPEC_MODES)} (default: auto)",
    )
    p.add_argument("--spec-k", type=int, default=4, help=f"drafts per verify, 1..{MAX_K}")
    p.add_argument(
        "--profile",
        action="store_true",
        help="print one line per forward (gemm/attn/other ms, GB/s) to stderr",
    )


def _cmd_chat(args) -> int:
    from .chat_cli import cmd_chat

    return cmd_chat(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="merlin-cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="architecture, sizes and bytes per token of a checkpoint")
    _add_model_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("generate", help="stream an answer to PROMPT")
    _add_model_args(p)
    p.add_argument("prompt", metavar="PROMPT")
    _add_generation_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "chat",
        help="a conversation: user turns from stdin, one per line ('/image PATH' on its own "
        "line attaches an image to the next turn); --session FILE continues it across runs",
    )
    _add_model_args(p)
    _add_generation_args(p)
    p.add_argument(
        "--session",
        default=None,
        metavar="FILE",
        help="restore the conversation from FILE if it matches the model; save after each turn",
    )
    p.set_defaults(func=_cmd_chat)

    p = sub.add_parser(
        "warmup", help="compile the kernels for the given formats ahead of time, with progress"
    )
    from .warmup import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("logits", help="save prefill logits for every prompt position")
    _add_model_args(p)
    p.add_argument("prompt", metavar="PROMPT")
    p.add_argument("--system", default=None)
    _add_image_args(p)
    p.add_argument("--out", required=True, help="FILE.npy")
    p.set_defaults(func=cmd_logits)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "max_new_tokens", 1) < 1:
            raise MerlinError("--max-new-tokens must be at least 1.")
        return args.func(args)
    except MerlinError as e:
        print(f"merlin-cli: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("merlin-cli: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
