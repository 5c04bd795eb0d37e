"""`merlin`: the desktop app entry point."""

from __future__ import annotations

import argparse
import os
import sys

from merlin.engine.formats import DEFAULT_KV, DEFAULT_WEIGHTS, KV_FORMATS, WEIGHT_CHOICES


def parse_args(argv):
    p = argparse.ArgumentParser(prog="merlin", description="Chat with Qwen3-VL models locally.")
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder, 'demo' or 'random-2b' (default: the last one used, "
        "or the demo checkpoint)",
    )
    p.add_argument(
        "--weights",
        default=None,
        help="weights format: auto (q4 or q8, the faster here), f32, q8 or q4 (default: the "
        "last one used, else auto; with --warmup also "
        "several, comma-separated, or all)",
    )
    p.add_argument(
        "--kv", default=None, help="KV cache format: f32 or q8 (with --warmup: also all)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="kernel threads (default: the settings' value; 0 = one per CPU in use)",
    )
    p.add_argument(
        "--cpus",
        default=None,
        metavar="big|all|LIST",
        help="CPUs to run on: big (the big cores of a big.LITTLE CPU, the default), all, or a "
        "list like 0-3,6",
    )
    p.add_argument(
        "--warmup",
        action="store_true",
        help="compile the kernels for --weights/--kv (default: the settings' formats) into the "
        "cache, showing progress, then exit",
    )
    p.add_argument("--json-progress", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--self-test",
        action="store_true",
        help="load the demo checkpoint (or --model), answer a question about an image, render "
        "the window offscreen; exit 0 if all worked",
    )
    p.add_argument("--fullscreen", action="store_true", help="kiosk: fill the screen")
    p.add_argument(
        "--demo-mode",
        action="store_true",
        help="large text and a big performance panel (for a TV or a projector)",
    )
    p.add_argument(
        "--lang", choices=("system", "en", "zh_CN"), default=None, help="user interface language"
    )
    p.add_argument(
        "--demo-screenshot",
        metavar="PATH",
        default=None,
        help="run a scripted exchange with an image offscreen and save a 1280x720 "
        "PNG of the window",
    )
    p.add_argument("--quit-after-load", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--script",
        metavar="FILE",
        default=None,
        help="send the lines of FILE as user messages, one after each answer, printing SENT "
        "<id> <line> once each is saved; exit after the last answer (for crash tests)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.warmup:
        return _warmup(args)
    for flag, value, choices in (
        ("--weights", args.weights, WEIGHT_CHOICES),
        ("--kv", args.kv, KV_FORMATS),
    ):
        if value is not None and value not in choices:
            print(f"merlin: {flag} must be one of {', '.join(choices)}", file=sys.stderr)
            return 2
    placement = _place(args)
    if placement is None:
        return 2
    if args.self_test:
        from merlin.app.modes.selftest import run as self_test

        return self_test(
            model=args.model or "demo", weights=args.weights or "f32", kv=args.kv or "f32"
        )
    if args.demo_screenshot:
        from merlin.app.modes.screenshot import run

        return run(args.demo_screenshot, model=args.model or "", language=args.lang or "en")
    if args.script:
        from merlin.app.modes.scripted import run as run_script

        return run_script(args.script, model=args.model, weights=args.weights, kv=args.kv)

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Merlin")
    app.setApplicationDisplayName("Merlin")
    app.setDesktopFileName("merlin")

    from merlin.app.settings import load_settings
    from merlin.app.widgets.window import MainWindow

    settings = load_settings()
    if args.lang:
        settings.language = args.lang
    if args.demo_mode:
        settings.demo_mode = True
    window = MainWindow(
        model_folder=args.model, weights=args.weights, kv=args.kv, settings=settings
    )
    if args.quit_after_load:
        window.sig_model_ready.connect(app.quit)
    if args.fullscreen:
        window.toggle_fullscreen(True)
    else:
        window.show()
    return app.exec()


def _saved_settings():
    """The user's settings (None when Qt is unusable: then only flags count)."""
    try:
        from merlin.app.settings import load_settings

        return load_settings()
    except ImportError:
        return None


def _place(args):
    """Pin to the CPUs of --cpus (or the settings, or MERLIN_CPUS; default the big cores) with
    --threads kernel threads, before anything runs a kernel."""
    from merlin.engine.cpu import place
    from merlin.engine.errors import MerlinError

    settings = _saved_settings() if args.cpus is None or args.threads is None else None
    cpus = args.cpus or os.environ.get("MERLIN_CPUS") or (settings.cpus if settings else None)
    threads = args.threads if args.threads is not None else (settings.threads if settings else 0)
    try:
        return place(cpus, threads or None)
    except MerlinError as e:
        print(f"merlin: {e}", file=sys.stderr)
        return None


def _warmup(args) -> int:
    """`merlin --warmup`: compile the kernels with progress on the terminal (no window)."""
    from merlin.engine import warmup
    from merlin.engine.errors import MerlinError

    settings = None if args.weights and args.kv else _saved_settings()
    try:
        return warmup.run(
            args,
            default_weights=settings.weights if settings else DEFAULT_WEIGHTS,
            default_kv=settings.kv if settings else DEFAULT_KV,
        )
    except MerlinError as e:
        print(f"merlin: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
