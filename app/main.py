"""`merlin`: the desktop app entry point."""

from __future__ import annotations

import argparse
import sys


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
        choices=("f32", "q8", "q4"),
        default=None,
        help="weights format (default: the last one used)",
    )
    p.add_argument("--kv", choices=("f32", "q8"), default=None, help="KV cache format")
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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.demo_screenshot:
        from .screenshot import run

        return run(args.demo_screenshot, model=args.model or "", language=args.lang or "en")

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Merlin")
    app.setApplicationDisplayName("Merlin")
    app.setDesktopFileName("merlin")

    from .settings import load_settings
    from .window import MainWindow

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


if __name__ == "__main__":
    sys.exit(main())
