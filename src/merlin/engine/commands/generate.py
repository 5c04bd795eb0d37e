"""merlin-cli generate (stream an answer to one prompt) and logits (save the prefill logits of
every prompt position)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from .. import replace_file
from ..errors import InputError, MerlinError
from ..speculative import SpecPolicy
from .args import (
    ReasoningPrinter,
    add_generation_args,
    add_image_args,
    add_model_args,
    answer_options,
    emit,
    format_profile,
    load,
    note,
    prompt,
)


def register(sub) -> None:
    p = sub.add_parser("generate", help="stream an answer to PROMPT")
    add_model_args(p)
    p.add_argument("prompt", metavar="PROMPT")
    add_generation_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("logits", help="save prefill logits for every prompt position")
    add_model_args(p)
    p.add_argument("prompt", metavar="PROMPT")
    p.add_argument("--system", default=None)
    add_image_args(p)
    p.add_argument("--out", required=True, help="FILE.npy")
    p.set_defaults(func=cmd_logits)


def cmd_generate(args) -> int:
    from ..generate import Finished, Tokens, event_json, generate

    model = load(args)
    options = answer_options(args, model)
    built = prompt(args, model)
    out = sys.stdout
    shown = ReasoningPrinter()
    _, notice = SpecPolicy.or_off(args.spec, args.spec_k)
    if notice:
        note(f"warning: {notice}")
    for event in generate(model, built, options, max_context=args.max_context):
        if args.profile and isinstance(event, Tokens) and event.ids:
            print(format_profile(event.profile), file=sys.stderr)
        if args.json:
            emit(out, event_json(event))
        elif isinstance(event, Tokens):
            shown.tokens(event, out)
        elif isinstance(event, Finished):
            shown.end()
            out.write("\n")
            vision = f"vision {event.vision_ms:.0f} ms, " if event.vision_ms else ""
            print(
                f"[{event.reason}: {event.generated_tokens} tokens, {vision}"
                f"prefill {event.prefill_ms:.0f} ms, {event.tokens_per_s:.1f} tok/s]",
                file=sys.stderr,
            )
    return 0


def _logits_target(name: str) -> Path:
    """The file --out names (through a symlink), checked: not a folder, not a device."""
    out = replace_file.target(Path(os.path.expanduser(name)))
    if out.is_dir():
        raise InputError(f"--out {name} is a folder; give a file name, e.g. {out / 'logits.npy'}.")
    if out.exists() and not out.is_file():
        raise InputError(f"--out {name} is not a regular file (a device or a pipe).")
    if not out.parent.is_dir():
        raise InputError(f"--out {name}: the folder {out.parent} does not exist.")
    return out


def _save_exactly(out: Path, array: np.ndarray) -> None:
    """np.save to `out` itself (np.save on a name adds ".npy"), replacing it atomically
    (engine.replace_file: no temporary left on a failure or Ctrl-C)."""
    try:
        with replace_file.replacing(out) as f:
            np.save(f, array)
    except OSError as e:
        raise MerlinError(f"{out}: cannot write ({e.strerror or e}).") from None


def cmd_logits(args) -> int:
    from ..generate import check_prompt, image_inputs

    out = _logits_target(args.out)  # before any work: a bad --out fails at once
    model = load(args)
    built = prompt(args, model)
    check_prompt(model, built.ids, model.max_context)
    cache = model.new_cache(len(built.ids))
    kw = {}
    if built.spans:
        inputs = image_inputs(model, built)
        kw = dict(embeds=inputs.embeds, embed_rows=inputs.rows, deepstack=inputs.deepstack)
    # every row's logits: one forward (prefill() keeps only the last row's)
    logits = model.text.forward(np.asarray(built.ids), built.positions, cache, logits="all", **kw)
    _save_exactly(out, logits.astype(np.float32))
    print(
        f"saved logits {logits.shape} for {len(built.ids)} prompt tokens to {out}", file=sys.stderr
    )
    return 0
