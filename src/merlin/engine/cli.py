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
import os
import signal
import sys
import threading

# nothing heavy at import: a Ctrl-C while NumPy and Numba load is inside main's handling
from .errors import EXIT_USER_ERROR, MerlinError

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


def __getattr__(name: str):
    if name == "format_profile":  # a public name of this module, imported when asked
        from .commands.args import format_profile

        return format_profile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def _exits_on_termination() -> dict:
    """SIGTERM and SIGHUP end the command as Python exceptions do, so that a file being
    written is removed, not left as a hidden temporary (the default ends the process at
    once). Returns the handlers replaced (none off the main thread, where Python cannot
    set them)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}


def _standard_streams() -> None:
    """A command started with stdin or stdout closed (`<&-`, `>&-`) reads nothing and
    writes nowhere instead of failing on None."""
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # for the whole process
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")


def _check_numba_environment() -> None:
    """NUMBA_NUM_THREADS=0 (or below) makes Numba's import raise: said before it is imported."""
    value = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if value.lstrip("-").isdigit() and int(value) < 1:
        raise MerlinError(
            f"NUMBA_NUM_THREADS={value}: it must be at least 1; unset it (Merlin uses every "
            "CPU it may) or give merlin-cli --threads N."
        )


def _silence_stdout() -> None:
    """After a write to stdout failed, the interpreter's last flush must not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    replaced = _exits_on_termination()
    try:
        _standard_streams()
        _check_numba_environment()
        tolerate_unencodable_output()
        args = build_parser().parse_args(argv)
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
        _silence_stdout()
        return 0
    except OSError as e:  # e.g. the output on a full disk (/dev/full), a name too long
        where = f"{e.filename}: " if e.filename else ""
        print(f"merlin-cli: error: {where}{e.strerror or e}", file=sys.stderr)
        _silence_stdout()
        return EXIT_USER_ERROR
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
