"""`merlin`: the desktop app entry point."""

from __future__ import annotations

import argparse
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(prog="merlin", description="Chat with Qwen3-VL models locally.")
    p.add_argument("--model", default="", help="checkpoint folder (default: the demo checkpoint)")
    p.add_argument("--fullscreen", action="store_true", help="kiosk: fill the screen")
    p.add_argument("--quit-after-load", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from PySide6.QtWidgets import QApplication

    from .window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Merlin")
    window = MainWindow(model_folder=args.model)
    if args.quit_after_load:
        window.sig_model_ready.connect(app.quit)
    if args.fullscreen:
        window.showFullScreen()
    else:
        window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
