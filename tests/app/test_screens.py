"""The window on the screens Merlin is shown on (issue 26, item 6): 1280x720 and 1920x1080,
in demo mode (F10) and at 1280x720 without it, in English and in Chinese, with a conversation,
a picture, the panel filled and a draft counted by the context meter. Nothing clips or
overlaps (tests/app/layout_checks.py measures every label and button with its font metrics
and compares the rectangles of each layout's widgets), the window stays within the screen and
the panel's content within the panel. The checker itself is checked on widgets made to fail.

docs/screenshots/ holds the same window photographed under Xvfb (scripts/screenshots.py)."""

from __future__ import annotations

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)
from layout_checks import clipped, overlapping, problems
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from merlin.engine.demo_scenes import save_showcase

DRAFT = {"en": "And what shape is green?", "zh_CN": "绿色的是什么形状？"}


@pytest.mark.parametrize("language", ["en", "zh_CN"])
@pytest.mark.parametrize("size, demo", [((1280, 720), True), ((1920, 1080), True),
                                        ((1280, 720), False)])  # fmt: skip
def test_nothing_clips_or_overlaps(qtbot, make_window, tmp_path, language, size, demo):
    w = make_window(language=language)
    w.resize(*size)
    w.set_demo_mode(demo)
    w.composer.add_paths([str(save_showcase(tmp_path / "shapes.png"))])
    w.composer.wait_attachments()
    send(qtbot, w, "What colour is the circle?")
    w.composer.set_text(DRAFT[language])
    meter = w.controller.meter
    qtbot.waitUntil(lambda: meter.last is not None and meter.last.serial == meter.serial
                    and not meter.timer.isActive(), timeout=30_000)  # fmt: skip
    w.panel.refresh(force=True)
    qtbot.wait(100)
    assert w.composer.meter.isVisibleTo(w) and w.panel.isVisibleTo(w)
    assert w.panel.values["prefill"].text() != "–"  # the panel is filled
    assert (w.width(), w.height()) == size  # the window fits the screen
    assert w.panel.minimumSizeHint().height() <= w.panel.height()
    assert problems(w) == []
    edit = w.composer.edit  # one line of text, in its language's font: no scroll bar
    assert not edit.verticalScrollBar().isVisible(), edit.height()
    w.set_demo_mode(False)


@pytest.mark.parametrize("language", ["en", "zh_CN"])
def test_the_narrowest_panel_wraps_and_never_clips(qtbot, make_window, language):
    w = make_window(language=language)
    send(qtbot, w, "What colour is the circle?")
    total = sum(w.splitter.sizes())
    w.splitter.setSizes([0, total, 0])  # every side at its minimum width
    w.panel.refresh(force=True)
    qtbot.wait(100)
    assert w.panel.width() == w.panel.minimumWidth()
    assert problems(w) == []


def test_the_checker_sees_clipped_text_and_overlaps(qtbot):
    root = QWidget()
    qtbot.addWidget(root)
    row = QHBoxLayout(root)
    label, button, fine = QLabel("a label far too long for its width"), QPushButton(), QLabel("ok")
    button.setText("a button far too long for its width")
    for w in (label, button, fine):
        w.setFixedWidth(60) if w is not fine else None
        row.addWidget(w)
    root.resize(400, 60)
    root.show()
    qtbot.wait(20)
    found = clipped(root)
    assert len(found) == 2 and "label far" in found[0] and "button far" in found[1]
    assert overlapping(root) == []
    fine.setGeometry(label.geometry().adjusted(10, 0, 10, 0))  # moved over its neighbour
    assert len(overlapping(root)) >= 1
    wrapped = QLabel("words " * 40, root)
    wrapped.setWordWrap(True)
    wrapped.setGeometry(0, 0, 100, 20)
    wrapped.show()
    assert any("height" in p for p in clipped(root))
