"""The composer's context meter (app/context_meter.py) through the real window on the demo
checkpoint: its count is the prompt length the engine then reports for the turn, pictures add
their budgeted tokens, amber near the budget and red when the draft cannot fit, and typing fast
sends few count requests (the GUI never counts: the engine thread does)."""

from __future__ import annotations

from gui_helpers import data_dir, make_window, wait_idle  # noqa: F401 (fixtures)
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage, QPalette

from merlin.app.model.counting import AMBER_FRACTION, CountReport, LatestBox
from merlin.app.widgets import theme


def png(path, w=320, h=240, color="#3A6EA5"):
    image = QImage(w, h, QImage.Format_RGB32)
    image.fill(QColor(color))
    assert image.save(str(path), "PNG")
    return str(path)


def counted(qtbot, w) -> CountReport:
    """The meter's report for the composer as it is now."""
    m = w.controller.meter
    m.schedule()
    qtbot.waitUntil(lambda: not m.timer.isActive(), timeout=5000)
    qtbot.waitUntil(lambda: m.last is not None and m.last.serial == m.serial, timeout=30_000)
    return m.last


def send_now(qtbot, w) -> int:
    """Press Enter; the prompt length the engine reported for the turn."""
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    wait_idle(qtbot, w)
    return w.stats.prefill_tokens + w.stats.reused_tokens


def _switch(w, **changes):
    new = type(w.settings)(**vars(w.settings))
    for k, v in changes.items():
        setattr(new, k, v)
    w.apply_settings(new)


def test_the_count_is_the_prompt_the_engine_then_sees(qtbot, make_window):
    w = make_window()
    w.composer.set_text("Tell me about the circle and the square, please.")
    first = counted(qtbot, w)
    label = w.composer.meter
    assert label.isVisibleTo(w) and first.available and first.fits
    assert label.text() == f"{first.tokens:,} / 8,192 tokens"
    assert send_now(qtbot, w) == first.tokens
    assert w.stats.reused_tokens == 0
    # the next turn: the conversation so far (as the engine session holds it) plus the draft
    empty = counted(qtbot, w)
    assert empty.tokens > first.tokens  # the conversation is in context now
    w.composer.set_text("And what colour is it?")
    second = counted(qtbot, w)
    assert second.tokens > empty.tokens
    assert send_now(qtbot, w) == second.tokens
    assert w.stats.reused_tokens > 0  # the cache was reused, the count is still the whole


def test_a_picture_adds_its_image_tokens(qtbot, make_window, tmp_path):
    w = make_window()
    w.composer.set_text("What is in the picture?")
    text_only = counted(qtbot, w)
    w.composer.add_paths([png(tmp_path / "lake.png", 1280, 960)])  # more than the default
    w.composer.wait_attachments()
    with_image = counted(qtbot, w)
    assert with_image.image_tokens > 0
    # the engine's own budget: the tokens the attach-time encode reported for this picture
    images = w.controller.images
    qtbot.waitUntil(lambda: bool(images._tokens), timeout=30_000)
    assert list(images._tokens.values())[-1] == with_image.image_tokens
    assert with_image.tokens == text_only.tokens + with_image.image_tokens + 2  # + start/end
    assert "pictures take" in w.composer.meter.toolTip()
    # a smaller detail for this picture: fewer tokens, counted from the engine's budget
    chip = w.composer.chip(w.composer.attachments()[0])
    chip.choose_detail("fast")
    fast = counted(qtbot, w)
    assert 0 < fast.image_tokens <= 256 < with_image.image_tokens
    assert send_now(qtbot, w) == fast.tokens


def test_amber_near_the_budget_and_red_when_it_cannot_fit(qtbot, make_window):
    w = make_window()
    w.composer.set_text("The quick brown fox jumps over the lazy dog. " * 8)
    r = counted(qtbot, w)
    label = w.composer.meter
    assert r.level == "ok" and label.palette().color(QPalette.WindowText) == theme.muted_text()
    budget = int(r.tokens / AMBER_FRACTION) - 2  # above 85 %, still fits with the reserve
    assert r.tokens + r.reserve <= budget
    _switch(w, context_budget=budget)
    amber = counted(qtbot, w)
    assert amber.budget == budget and amber.fits and amber.level == "amber"
    assert label.palette().color(QPalette.WindowText) == theme.banner_colors("warning")[1]
    assert label.text() == f"{amber.tokens:,} / {budget:,} tokens"
    assert "Nearly full" in label.toolTip()
    _switch(w, context_budget=r.tokens)  # no room for the answer
    red = counted(qtbot, w)
    assert not red.fits and red.level == "red"
    assert label.palette().color(QPalette.WindowText) == theme.banner_colors("error")[1]
    assert "cannot be sent" in label.toolTip() and "context budget" in label.toolTip()


def test_typing_fast_sends_few_count_requests(qtbot, make_window):
    w = make_window()
    m = w.controller.meter
    counted(qtbot, w)
    before = m.requests
    text = "what colour is the big circle"
    qtbot.keyClicks(w.composer.edit, text, delay=15)  # ~450 ms of typing
    qtbot.waitUntil(lambda: not m.timer.isActive(), timeout=5000)
    qtbot.waitUntil(lambda: m.last is not None and m.last.serial == m.serial, timeout=30_000)
    assert 1 <= m.requests - before <= 3  # not one per keystroke (30)
    assert w.composer.text() == text


def test_latest_box_keeps_only_the_newest():
    box = LatestBox()
    for i in range(5):
        box.put(i)
    assert box.take() == 4 and box.take() is None


def test_the_meter_follows_a_language_switch(qtbot, make_window):
    w = make_window()
    w.composer.set_text("hello")
    counted(qtbot, w)
    _switch(w, language="zh_CN")
    r = counted(qtbot, w)
    assert "词元" in w.composer.meter.text() and f"{r.tokens:,}" in w.composer.meter.text()
    _switch(w, language="en")


def test_an_edit_counts_the_conversation_up_to_the_edited_message(qtbot, make_window):
    w = make_window()
    for text in ("The first question about the circle?", "A second question?"):
        w.composer.set_text(text)
        send_now(qtbot, w)
    whole = counted(qtbot, w)
    first = w.store.messages(w.controller.current_id)[0]
    w.controller.begin_edit(first.id)
    w.controller.ask = lambda title, text: True  # yes, replace the messages after it
    w.composer.set_text("An edited first question?")
    edited = counted(qtbot, w)
    assert edited.tokens < whole.tokens  # the later turns are not part of it
    assert send_now(qtbot, w) == edited.tokens


def test_a_picture_larger_than_the_context_is_red_with_the_reason(qtbot, make_window, tmp_path):
    w = make_window()
    _switch(w, context_budget=64)
    w.composer.set_text("What is this?")
    w.composer.add_paths([png(tmp_path / "big.png", 1280, 960)])
    w.composer.wait_attachments()
    r = counted(qtbot, w)
    assert not r.fits and r.level == "red" and r.problem
    # the picture's budget shrinks to what the context holds; with the text it still cannot fit
    assert w.composer.meter.text() in (f"{r.tokens} / 64 tokens", "? / 64 tokens")
    assert r.tokens == 0 or r.tokens + r.reserve > 64
    assert r.problem in w.composer.meter.toolTip()
