"""`merlin --self-test`: does this installation work? Loads the demo checkpoint, answers a
question about an image, renders the window offscreen, and exits 0; on any failure it prints
what failed and exits 1. On the built-in demo model (trained on pictures of shapes) the answer
must also be the reference one: the question is about a drawn scene, and the checkpoint holds
the answer transformers gave to it (engine.demo_model.self_test_reference), so wrong numbers
anywhere in the engine (a kernel, RoPE, image placement) fail the test as a different answer.

It runs the real app (window, worker thread, engine, kernels) offscreen in a temporary data
folder, so it works without a screen (over ssh, in a bundle, under emulation) and never
touches the user's chats or settings. The Numba cache is the user's: a warm cache makes it fast.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

QUESTION = "What is in this picture?"
DEFAULT_TIMEOUT_S = 3600.0  # a cold compile under emulation is slow; a board takes a minute


def run(
    model: str = "demo",
    weights: str = "f32",
    kv: str = "f32",
    screenshot: str | None = None,
    timeout_s: float | None = None,
) -> int:
    """The self-test in a data folder of its own, removed at the end (a user may run it at
    any time; each run had left a megabyte in the temporary folder)."""
    scratch = Path(tempfile.mkdtemp(prefix="merlin-self-test-"))
    try:
        return _run_in(scratch, model, weights, kv, screenshot, timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_in(scratch: Path, model, weights, kv, screenshot, timeout_s) -> int:
    if timeout_s is None:
        timeout_s = float(os.environ.get("MERLIN_SELF_TEST_TIMEOUT", DEFAULT_TIMEOUT_S))
    t_start = time.perf_counter()

    def say(text: str) -> None:
        print(f"self-test [{time.perf_counter() - t_start:7.1f} s] {text}", flush=True)

    def fail(text: str) -> int:
        print(f"self-test FAILED: {text}", file=sys.stderr, flush=True)
        return 1

    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    os.environ["MERLIN_DATA_DIR"] = str(scratch / "data")
    try:
        from PySide6.QtCore import QElapsedTimer, QEventLoop
        from PySide6.QtWidgets import QApplication

        from merlin.app.modes.demo_image import draw_demo_image
        from merlin.app.settings import AppSettings
        from merlin.app.widgets.window import MainWindow
    except ImportError as e:
        return fail(f"Qt could not be loaded ({e}); install Qt's system libraries.")

    from merlin.engine import version

    say(f"Merlin {version.__version__}, Python {sys.version.split()[0]}, {_machine()}")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Merlin")
    settings = AppSettings(language="en", max_new_tokens=12, panel_visible=True)
    window = MainWindow(model_folder=model, weights=weights, kv=kv, settings=settings)
    window.resize(1280, 720)
    window.show()
    clock = QElapsedTimer()
    clock.start()
    phases: list[str] = []
    window.controller.sig_load_progress.connect(
        lambda f, phase: (
            (phases.append(phase), say(f"loading {f * 100:3.0f}% {phase}"))
            if not phases or phases[-1] != phase
            else None
        )
    )

    def wait(predicate) -> bool:
        while not predicate():
            if clock.elapsed() > timeout_s * 1000:
                return False
            app.processEvents(QEventLoop.AllEvents, 50)
        return True

    c = window.controller
    try:
        name = "the demo checkpoint" if model == "demo" else model
        say(f"loading {name} ({weights} weights, {kv} KV)")
        if not wait(lambda: c.loading is None):
            return fail(f"the model did not load within {timeout_s:.0f} s")
        if c.model is None:
            return fail(f"the model failed to load: {window.model_banner.text()}")
        if not c.model.vision:
            return fail(f"the vision encoder is not usable: {c.model.vision_problem}")
        say(f"loaded in {c.model.load_s:.1f} s: {c.model.description}")

        expected = truth = None
        question = QUESTION
        if c.model.demo_model:  # a trained model: a wrong number shows up as another answer
            from merlin.engine import demo_model, demo_scenes

            image = demo_scenes.save_showcase(scratch / "shapes.png")
            case = demo_model.self_test_reference(c.model.folder)
            question, expected, truth = case["question"], case["answer"], case["truth"]
        else:
            image = draw_demo_image(scratch / "lake.png")
        states: list[str] = []
        c.sig_answer_finished.connect(states.append)
        window.composer.add_paths([str(image)])
        window.composer.wait_attachments()
        say(f"asking about an image: {question!r}")
        if not c.send(question, window.composer.attachments()):
            return fail("the question could not be sent")
        window.composer.clear()
        if not wait(lambda: states):
            return fail(f"no answer within {timeout_s:.0f} s")
        rows = c.store.messages(c.current_id) if c.current_id else []
        answer = rows[-1] if rows and rows[-1].role == "assistant" else None
        if answer is None:
            return fail("no answer was stored")
        if states[-1] != "done":
            why = answer.stats.get("error", states[-1])
            return fail(f"the answer ended in state {states[-1]!r}: {why}")
        if not answer.text.strip():
            return fail("the answer is empty")
        # encoded by the answer, or on attach (its rows then computed while typing)
        on_attach = any(st.state == "done" for st in c.images.last.values())
        if not answer.stats.get("vision_ms") and not on_attach:
            return fail("the image did not go through the vision encoder")
        if expected is not None and answer.text.strip() != expected:
            return fail(
                f"the demo model answered {answer.text.strip()!r} to {question!r}, not "
                f"{expected!r} as transformers does on the same checkpoint: the engine "
                "computes wrong numbers on this machine"
            )
        s = answer.stats
        say(
            f"answered: {s.get('tokens')} tokens, vision {s.get('vision_ms', 0):.0f} ms, "
            f"prefill {s.get('prefill_ms', 0):.0f} ms, {s.get('tokens_per_s', 0):.1f} tokens/s "
            + _verdict(expected, truth)
        )

        window.panel.refresh(force=True)
        for _ in range(5):
            app.processEvents()
        picture = window.grab().toImage()
        if picture.isNull() or picture.width() < 100 or picture.height() < 100:
            return fail("the window could not be rendered")
        if len({picture.pixel(x, y) for x in range(0, picture.width(), 37)
                for y in range(0, picture.height(), 29)}) < 8:  # fmt: skip
            return fail("the rendered window is blank")
        size = f"{picture.width()}x{picture.height()}"
        if screenshot:
            out = Path(os.path.expanduser(screenshot))
            out.parent.mkdir(parents=True, exist_ok=True)
            picture.save(str(out), "PNG")
            say(f"rendered the window offscreen ({size}): {out}")
        else:
            say(f"rendered the window offscreen ({size})")
    finally:
        window.close()
        app.processEvents()
    say("PASSED")
    return 0


def _machine() -> str:
    import platform

    try:
        from merlin.engine.cpu import choose

        placement = choose(os.environ.get("MERLIN_CPUS") or "big").describe()
    except Exception as e:  # informational only
        placement = f"placement unknown ({e})"
    return f"{platform.machine()}, {placement}"


def _verdict(expected: str | None, truth: str | None) -> str:
    if expected is None:
        return "(random weights: the text is random)"
    if expected == truth:
        return f"(the reference answer, and right: {expected!r})"
    return f"(the reference answer {expected!r}; the small model is wrong here: {truth!r})"
