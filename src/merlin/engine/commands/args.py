"""Argument helpers shared by merlin-cli's subcommands: the model, image and generation
options, loading the model they name, and the one-line profile of a forward.

Every subcommand module (engine/commands/*.py) imports from here; nothing here imports a
subcommand, so the CLI has no import cycles (engine/cli.py dispatches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..errors import EXIT_USER_ERROR, InputError  # noqa: F401 (the subcommands' exit status)
from ..formats import DEFAULT_KV, DEFAULT_WEIGHTS
from ..speculative import MAX_K, SPEC_MODES


def emit(out, obj: dict) -> None:
    """One JSON object per line (the --json event stream)."""
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def note(msg: str) -> None:
    print(f"merlin-cli: {msg}", file=sys.stderr)


def model_dir(arg: str | None) -> Path:
    """The checkpoint folder --model names; without --model the built-in demo model. An empty
    --model (a shell variable that is not set) is an error, not the demo model."""
    if arg is not None and not arg.strip():
        raise InputError(
            "--model is empty; give a checkpoint folder, or leave --model out for the demo model."
        )
    if arg:
        return Path(os.path.expanduser(arg))
    from ..demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint()


def load(args):
    from ..cpu import place
    from ..model import load_model

    place(getattr(args, "cpus", None), args.threads)
    mapped = {"auto": None, "yes": True, "no": False}[getattr(args, "map_experts", "auto")]
    return load_model(
        model_dir(args.model),
        weights=args.weights,
        kv=args.kv,
        map_experts=mapped,
        vision_weights=getattr(args, "vision_weights", None),
    )


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint folder (default: the built-in demo checkpoint)")
    p.add_argument(
        "--weights",
        default=DEFAULT_WEIGHTS,
        help=f"weight format: auto (q4 or q8, the faster here), f32, q8 or q4 "
        f"(default {DEFAULT_WEIGHTS})",
    )
    p.add_argument(
        "--kv", default=DEFAULT_KV, help=f"KV cache format: f32 or q8 (default {DEFAULT_KV})"
    )
    p.add_argument(
        "--map-experts",
        choices=("auto", "yes", "no"),
        default="auto",
        help="mixture-of-experts models: keep the quantized experts memory-mapped from the "
        "weight cache (auto: only when the model does not fit in memory otherwise)",
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


def add_image_args(p: argparse.ArgumentParser) -> None:
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


def prompt(args, model):
    """The prompt (ids, 3D positions, rope delta) with the --image files prepared."""
    from ..prompt import build_prompt

    images = []
    if args.image:
        from ..vision import budget

        model.vision.require()
        pre = model.vision.preprocess
        if hasattr(args, "max_context"):  # generate, chat: the budget asked, else the default
            context = min(args.max_context or model.default_context, model.max_context)
        else:  # logits: its cache is the prompt's own length, up to the model's maximum
            context = model.max_context
        if args.image_tokens is not None:  # the user's number: within the context too
            budget.check_budget(args.image_tokens, pre, context)
        max_px, _ = budget.resolve(pre, None, args.image_tokens, args.max_pixels, context)
        for path in args.image:
            image = model.vision.prepare(path, max_px)
            budget.check_image_fits(image.n_tokens, context, pre, str(path))  # before encoding
            images.append(image)
    kwargs = thinking_kwargs(args, model)
    return build_prompt(
        model.tokenizer, model.config, args.prompt, images, system=args.system,
        template_kwargs=kwargs,
    )  # fmt: skip


def thinking_kwargs(args, model) -> dict:
    """The chat template's variables for --thinking (InputError: `on` without support)."""
    from .. import thinking

    mode = getattr(args, "thinking", "auto")  # `logits` has no --thinking: the default
    return thinking.template_kwargs(thinking.support(model.tokenizer), mode)


def sampling(args, model):
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


def answer_options(args, model):
    """The generation flags as engine.generate.AnswerOptions."""
    from ..generate import AnswerOptions

    return AnswerOptions(
        sampling=sampling(args, model),
        max_new_tokens=args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        spec=args.spec,
        spec_k=args.spec_k,
        thinking=args.thinking,
        thinking_budget=args.thinking_budget,
    )


class ReasoningPrinter:
    """Prints a thinking model's reasoning to stderr between `[thinking]` and `[/thinking]`
    lines, the answer to `out` (so `> answer.txt` gets the answer alone)."""

    def __init__(self) -> None:
        self.open = False

    def tokens(self, event, out) -> None:
        if event.reasoning:
            if not self.open:
                sys.stderr.write("[thinking]\n")
                self.open = True
            sys.stderr.write(event.reasoning)
            sys.stderr.flush()
        if event.text:
            self.end()
            out.write(event.text)
            out.flush()

    def end(self) -> None:
        if self.open:
            sys.stderr.write("\n[/thinking]\n")
            sys.stderr.flush()
            self.open = False


def format_profile(p) -> str:
    """One readable line per forward: the headless twin of the app's performance panel."""
    line = (
        f"step {p.step:4d}  rows {p.n_tokens:4d}  emitted {p.emitted}  ctx {p.context:5d}  "
        f"gemm {p.gemm_ms:7.2f}  attn {p.attn_ms:6.2f}  other {p.other_ms:6.2f}  "
        f"total {p.total_ms:7.2f} ms  {p.gb_per_s:5.1f} GB/s"
    )
    if p.experts_read:  # a mixture-of-experts forward: experts read, weight bytes read
        line += f"  experts {p.experts_read}  weights {p.weight_bytes / 1e6:.1f} MB"
    if p.spec:
        line += "  " + " ".join(f"{k}={v}" for k, v in p.spec.items())
    return line


def add_generation_args(p: argparse.ArgumentParser) -> None:
    """The options of `generate`, shared by `chat`."""
    p.add_argument("--system", default=None, help="system prompt")
    add_image_args(p)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="context budget in tokens (default 8192, or the model's maximum if smaller)",
    )
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
        "--thinking",
        choices=("auto", "on", "off"),
        default="auto",
        help="a thinking model's <think> block: on, off, or auto (the template's default); "
        "its reasoning goes to stderr (with --json: the events' 'reasoning')",
    )
    p.add_argument(
        "--thinking-budget",
        type=int,
        default=None,
        metavar="N",
        help="after N reasoning tokens the engine closes the block and the model answers",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="print one line per forward (gemm/attn/other ms, GB/s) to stderr",
    )
