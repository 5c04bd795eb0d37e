"""`merlin --demo-screenshot PATH`: a scripted exchange with an image on the demo checkpoint,
offscreen, saved as a 1280x720 PNG of the window with the performance panel shown. run()
also takes another size, demo mode (F10) and a draft left in the composer (its context
meter counted); scripts/screenshots.py makes docs/screenshots/ with them under Xvfb. On the
built-in demo model the picture is a drawn scene of shapes and the questions are ones it was
trained to answer (engine.demo_scenes.SHOWCASE); on any other model, a landscape.

Runs in a temporary data folder (never the user's chats or settings).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

QUESTION = "What is in this picture? Describe it in a few sentences."
FOLLOW_UP = "Write a short Python function that counts the boats, and the formula $a^2+b^2=c^2$."
# On the built-in demo model (trained on pictures of shapes): questions it was trained on,
# about the showcase picture (engine.demo_scenes.SHOWCASE), in the interface's language: a
# description (it names every shape, so speculative drafts have something to hit), then the
# colour of one shape.
DEMO_QUESTIONS = {
    "en": ("Describe the picture.", "What colour is the star?"),
    "zh_CN": ("描述一下这张图片。", "星形是什么颜色的？"),
}


def run(
    path: str,
    model: str = "",
    size: tuple[int, int] = (1280, 720),
    language: str = "en",
    timeout_s: float = 600.0,
    demo: bool = False,
    draft: str = "",
) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    scratch = Path(tempfile.mkdtemp(prefix="merlin-screenshot-"))
    os.environ["MERLIN_DATA_DIR"] = str(scratch / "data")
    from PySide6.QtCore import QElapsedTimer, QEventLoop
    from PySide6.QtWidgets import QApplication

    from merlin.app.modes.demo_image import draw_demo_image
    from merlin.app.settings import AppSettings
    from merlin.app.widgets.thumbnails import thumbnails
    from merlin.app.widgets.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Merlin")
    settings = AppSettings(language=language, max_new_tokens=90, panel_visible=True)
    window = MainWindow(model_folder=model or None, settings=settings)
    window.resize(*size)
    window.show()
    if demo:
        window.set_demo_mode(True)
    clock = QElapsedTimer()
    clock.start()

    def wait(predicate) -> bool:
        while not predicate():
            if clock.elapsed() > timeout_s * 1000:
                return False
            app.processEvents(QEventLoop.AllEvents, 50)
        return True

    c = window.controller
    if not wait(lambda: c.loading is None):
        print("merlin: the model did not load in time", file=sys.stderr)
        return 1
    if c.model is None:
        print(f"merlin: the model failed to load: {window.model_banner.text()}", file=sys.stderr)
        return 1
    if c.model.demo_model:
        from merlin.engine.demo_scenes import save_showcase

        image = save_showcase(scratch / "shapes.png")
        question, follow_up = DEMO_QUESTIONS.get(language, DEMO_QUESTIONS["en"])
    else:
        image = draw_demo_image(scratch / "lake.png")
        question, follow_up = QUESTION, FOLLOW_UP
    window.composer.add_paths([str(image)])
    window.composer.wait_attachments()
    c.send(question, window.composer.attachments())
    window.composer.clear()
    if not wait(lambda: not c.busy):
        return 1
    if follow_up:
        settings.max_new_tokens = 60
        c.send(follow_up, [])
        if not wait(lambda: not c.busy):
            return 1
    if draft:  # the composer's context meter counts it on the engine thread
        window.composer.set_text(draft)
        meter = c.meter
        wait(lambda: not meter.timer.isActive())
        wait(lambda: meter.last is not None and meter.last.serial == meter.serial)
    window.panel.refresh(force=True)
    thumbnails().wait()
    for _ in range(5):
        app.processEvents()
    out = Path(os.path.expanduser(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    ok = window.grab().save(str(out), "PNG")
    if demo:
        window.set_demo_mode(False)  # the saved settings of a scratch folder: no matter
    window.close()
    print(f"merlin: screenshot saved to {out}" if ok else f"merlin: could not write {out}")
    return 0 if ok else 1
