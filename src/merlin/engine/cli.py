"""merlin-cli: headless use of the engine (info, generate, chat, warmup, logits, serve).

A dispatcher: each subcommand lives in a module that defines `register(subparsers)` (its
arguments and its `func`); shared options and the model loading are in
engine/commands/args.py. To add a subcommand, write its module and add one line to COMMANDS.

The flags are used by checks outside the test suite; keep them stable. Every error a user can
cause ends in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands.args import EXIT_USER_ERROR, format_profile  # noqa: F401 (public names)
from .errors import MerlinError

# subcommand modules, in the order `merlin-cli --help` lists them
COMMANDS = [
    "merlin.engine.commands.info",
    "merlin.engine.commands.generate",  # generate, logits
    "merlin.engine.commands.chat",
    "merlin.engine.commands.warmup",
    "merlin.engine.commands.serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="merlin-cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def tolerate_unencodable_output() -> None:
    """A terminal or pipe whose encoding cannot show a character of an answer (LANG=C, a
    Latin-1 console) gets "?" for it instead of a UnicodeEncodeError that ends the answer."""
    for stream, errors in ((sys.stdout, "replace"), (sys.stderr, "backslashreplace")):
        if hasattr(stream, "reconfigure"):  # stderr: a path in an error stays decodable
            stream.reconfigure(errors=errors)


def main(argv: list[str] | None = None) -> int:
    tolerate_unencodable_output()
    args = build_parser().parse_args(argv)
    try:
        from .cli_checks import check_args

        check_args(args)  # every numeric option bounded before any work (engine.limits)
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
