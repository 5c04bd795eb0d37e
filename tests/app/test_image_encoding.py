"""Images are encoded when attached, on the engine thread, while the user types
(app/image_encoding.py): the chip says what it costs, the answer does not encode it again,
removing the image or changing its detail cancels the work, the panel shows the encoder."""

from __future__ import annotations

import threading

from gui_helpers import data_dir, make_window, send, wait_idle  # noqa: F401 (fixtures)
from PIL import Image

from merlin.engine.vision.encoder import EncodeCancelled


def photo(path, w=300, h=200):
    Image.effect_noise((w, h), 60).convert("RGB").save(path)
    return str(path)


def statuses(window):
    seen = []
    window.controller.worker.sig_image.connect(lambda st: seen.append(st))
    return seen


def vision_of(window):
    return window.controller.worker._model.vision


def test_attached_image_is_encoded_before_send_and_not_again(qtbot, make_window, tmp_path):
    window = make_window()
    seen = statuses(window)
    vision = vision_of(window)
    vision.embeddings = type(vision.embeddings)()
    calls = []
    encode = vision.encode

    def counting(images, *args, **kwargs):
        calls.append(len(images))
        return encode(images, *args, **kwargs)

    vision.encode = counting
    try:
        window.composer.add_paths([photo(tmp_path / "a.png")])
        window.composer.wait_attachments()
        qtbot.waitUntil(lambda: any(s.state == "done" for s in seen), timeout=60_000)
        est = next(s for s in seen if s.state == "estimate")
        assert est.tokens > 0 and est.seconds > 0
        blocks = [s.done for s in seen if s.state == "encoding"]
        assert blocks == list(range(0, vision.encoder.cfg.depth))
        chip = window.composer.chip(window.composer.attachments()[0])
        qtbot.waitUntil(lambda: "read in" in chip.status.text(), timeout=10_000)
        assert chip.status.text().startswith(f"{est.tokens} tokens")
        qtbot.waitUntil(
            lambda: window.panel.values["vision"].text().endswith(("ms", " s")), timeout=10_000
        )
        assert calls == [1]
        # and the rows of a turn starting with it are computed while the user types
        worker = window.controller.worker
        qtbot.waitUntil(
            lambda: worker._session is not None and worker._session.cached_tokens > est.tokens,
            timeout=30_000,
        )
        send(qtbot, window, "What is in the picture?")
        wait_idle(qtbot, window)
        assert calls == [1]  # the answer found the embedding made on attach
        rows = window.store.messages(window.controller.current_id)
        assert rows[-1].role == "assistant" and rows[-1].state == "done"
    finally:
        vision.encode = encode


def _blocking_encode(vision, started):
    """An encode that waits until its cancel Event is set (a slow picture), then stops."""

    def slow(images, cancel=None, progress=None):
        started.set()
        assert cancel is not None and cancel.wait(30)
        raise EncodeCancelled

    return slow


def test_removing_the_image_cancels_its_encode(qtbot, make_window, tmp_path):
    window = make_window()
    seen = statuses(window)
    vision = vision_of(window)
    vision.embeddings = type(vision.embeddings)()
    encode = vision.encode
    started = threading.Event()
    vision.encode = _blocking_encode(vision, started)
    try:
        window.composer.add_paths([photo(tmp_path / "b.png")])
        window.composer.wait_attachments()
        qtbot.waitUntil(started.is_set, timeout=60_000)
        chip = window.composer.chip(window.composer.attachments()[0])
        chip.remove.click()
        qtbot.waitUntil(lambda: any(s.state == "cancelled" for s in seen), timeout=30_000)
        assert window.composer.attachments() == []
        # (seen fills on the engine thread; the GUI gets the status queued, a moment later)
        qtbot.waitUntil(lambda: window.panel.values["vision"].text() == "stopped", timeout=10_000)
    finally:
        vision.encode = encode


def test_changing_the_detail_encodes_again_at_that_budget(qtbot, make_window, tmp_path):
    window = make_window()
    seen = statuses(window)
    vision = vision_of(window)
    vision.embeddings = type(vision.embeddings)()
    encode = vision.encode
    started = threading.Event()
    vision.encode = _blocking_encode(vision, started)
    try:
        window.composer.add_paths([photo(tmp_path / "c.png", 1200, 900)])
        window.composer.wait_attachments()
        qtbot.waitUntil(started.is_set, timeout=60_000)
        first = next(s for s in seen if s.state == "estimate")
        vision.encode = encode
        chip = window.composer.chip(window.composer.attachments()[0])
        chip.choose_detail("fast")
        qtbot.waitUntil(lambda: any(s.state == "cancelled" for s in seen), timeout=30_000)
        qtbot.waitUntil(lambda: any(s.state == "done" for s in seen), timeout=60_000)
        second = [s for s in seen if s.state == "estimate"][-1]
        assert second.key != first.key and second.tokens <= 256 < first.tokens
        assert window.composer.image_tokens(window.composer.attachments()[0]) == 256
    finally:
        vision.encode = encode


def test_stop_during_the_answers_encode(qtbot, make_window, tmp_path):
    window = make_window()
    vision = vision_of(window)
    vision.embeddings = type(vision.embeddings)()
    encode = vision.encode
    started = threading.Event()
    vision.encode = _blocking_encode(vision, started)
    window.controller.images.ready = False  # attach without encoding: the answer encodes
    try:
        window.composer.add_paths([photo(tmp_path / "d.png")])
        window.composer.wait_attachments()
        send(qtbot, window, "Describe it.", wait=False)
        qtbot.waitUntil(started.is_set, timeout=60_000)
        window.controller.stop()
        wait_idle(qtbot, window)
        rows = window.store.messages(window.controller.current_id)
        assert rows[-1].role == "assistant" and rows[-1].state == "stopped"
    finally:
        vision.encode = encode
        window.controller.images.ready = True


def test_two_attached_images_have_their_rows_computed_before_send(qtbot, make_window, tmp_path):
    """Each attach computes the rows of a turn holding the images attached so far, so the
    answer to a question about both prefills only its text."""
    window = make_window()
    seen = statuses(window)
    window.composer.add_paths([photo(tmp_path / "a.png"), photo(tmp_path / "b.png", 200, 300)])
    window.composer.wait_attachments()
    qtbot.waitUntil(lambda: sum(s.state == "done" for s in seen) == 2, timeout=60_000)
    tokens = sum(s.tokens for s in seen if s.state == "estimate")
    worker = window.controller.worker
    qtbot.waitUntil(
        lambda: worker._session is not None and worker._session.cached_tokens > tokens,
        timeout=30_000,
    )
    held = worker._session.cached_tokens
    send(qtbot, window, "Compare the two pictures.")
    wait_idle(qtbot, window)
    answer = window.store.messages(window.controller.current_id)[-1]
    assert answer.state == "done"
    assert answer.stats["reused_tokens"] == held  # every row computed on attach was kept
    assert answer.stats["prompt_tokens"] < 32  # the question's text, not the pictures


def test_closing_the_window_stops_an_encode_in_progress(qtbot, make_window, tmp_path):
    """The window hides at once, and the engine thread is not left encoding a picture nobody
    will send (closing had waited up to 30 s for it)."""
    window = make_window()
    vision = vision_of(window)
    vision.embeddings = type(vision.embeddings)()
    started, outcome = threading.Event(), []

    def slow(images, cancel=None, progress=None):
        started.set()
        outcome.append(cancel.wait(30))
        raise EncodeCancelled

    vision.encode = slow
    window.composer.add_paths([photo(tmp_path / "e.png")])
    window.composer.wait_attachments()
    qtbot.waitUntil(started.is_set, timeout=60_000)
    window.close()
    assert not window.isVisible()
    assert outcome == [True] and window.controller.thread.isFinished()


def test_a_picture_refused_for_its_budget_leaves_the_engine_free(qtbot, make_window, tmp_path):
    """A detail whose tokens do not fit the context is an error on the chip, and the engine
    is free after it: its lock had stayed held, and every later answer waited for good."""
    window = make_window(context_budget=512)
    seen = statuses(window)
    window.composer.add_paths([photo(tmp_path / "big.png", 1200, 900)])
    window.composer.wait_attachments()
    qtbot.waitUntil(lambda: any(s.state in ("done", "error") for s in seen), timeout=60_000)
    window.composer.chip(window.composer.attachments()[0]).choose_detail("detailed")
    qtbot.waitUntil(lambda: seen[-1].state == "error", timeout=30_000)
    assert "context" in seen[-1].message
    assert not window.controller.worker.engine_lock.locked()
    window.composer.remove_attachment(window.composer.attachments()[0])
    send(qtbot, window, "hello?")
    assert window.store.messages(window.controller.current_id)[-1].state == "done"


def test_the_detail_presets_are_the_loaded_models(qtbot, make_window, shapes_dir):
    """The shipped demo model reads pictures in 16 to 25 tokens: its presets say so (they
    were Qwen3-VL's 256 / 1024 / 16384 whatever the model, and every choice was refused)."""
    from merlin.engine.vision.budget import PRESETS, preset_tokens

    window = make_window(model=str(shapes_dir))
    pre = window.controller.worker._model.vision.preprocess
    assert window.composer._presets == {k: preset_tokens(k, pre) for k in PRESETS}
    assert max(window.composer._presets.values()) < 256
