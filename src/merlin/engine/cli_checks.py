"""Bounds for merlin-cli's numeric options, checked before any work (engine.limits).

argparse only checks that `--max-context -5` is an integer; this checks that every number
the user gave is in its range, so a bad value ends in one line on stderr and exit status 2
before a checkpoint is read, a cache is sized or a seed reaches NumPy.
"""

from __future__ import annotations

from . import limits


def check_args(args) -> None:
    """InputError naming the option when a numeric option is out of range."""

    def opt(attr: str):
        return getattr(args, attr, None)

    if opt("max_new_tokens") is not None:
        limits.new_tokens(args.max_new_tokens, "--max-new-tokens")
    if opt("max_context") is not None:
        limits.context_tokens(args.max_context, "--max-context", allow_zero=False)
    if opt("seed") is not None:
        limits.seed(args.seed, "--seed")
    if opt("threads") is not None:
        limits.threads(args.threads, "--threads")
    if opt("max_pixels") is not None:
        limits.pixels(args.max_pixels, "--max-pixels")
    if opt("top_k") is not None:
        limits.integer(args.top_k, "--top-k", 0, limits.MAX_COUNT)
    # --spec-k out of range turns speculation off with a warning (SpecPolicy.or_off)
    if isinstance(opt("cpus"), str) and args.cpus.strip().lower() not in ("big", "all"):
        limits.cpu_list(args.cpus, "--cpus")
