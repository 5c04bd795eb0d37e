"""The panel's layout while answers stream and languages switch (issue 26's defects): the
splitter keeps the width it was given, every panel string follows a language switch, and the
chart's axis labels never overlap, in normal and in demo mode."""

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)

from merlin.app.widgets.perf_panel import grid_steps


def _switch(w, language):
    new = type(w.settings)(**vars(w.settings))
    new.language = language
    w.apply_settings(new)


def test_splitter_keeps_its_width_while_an_answer_streams(qtbot, make_window):
    w = make_window(max_new_tokens=40)
    qtbot.wait(50)
    before = w.splitter.sizes()
    seen = set()
    send(qtbot, w, "tell me a long story", wait=False)
    qtbot.waitUntil(lambda: w.controller.busy, timeout=10_000)
    while w.controller.busy:
        w.panel.refresh(force=True)  # values change as fast as they can
        seen.add(tuple(w.splitter.sizes()))
        qtbot.wait(20)
    w.panel.values["prefill"].setText("1234567 ms · computed 123456 / reused 123456 tok " * 3)
    qtbot.wait(50)
    seen.add(tuple(w.splitter.sizes()))
    assert seen == {tuple(before)}


def test_user_width_is_kept(qtbot, make_window):
    w = make_window(max_new_tokens=20)
    sizes = w.splitter.sizes()
    wanted = [sizes[0], sizes[1] - 100, sizes[2] + 100]
    w.splitter.setSizes(wanted)
    qtbot.wait(20)
    send(qtbot, w, "hello")
    w.panel.refresh(force=True)
    qtbot.wait(50)
    assert w.splitter.sizes() == wanted


def test_every_panel_string_follows_a_language_switch(qtbot, make_window):
    w = make_window()
    send(qtbot, w, "hello")
    w.panel.refresh(force=True)
    p = w.panel
    assert "computed" in p.values["prefill"].text()
    english_model = p.model_label.text()
    _switch(w, "zh_CN")
    qtbot.waitUntil(lambda: w.composer.send_button.text() == "发送", timeout=5000)
    prefill = p.values["prefill"].text().replace("\u2060", "")  # the word joiners aside
    assert "computed" not in prefill and "计算" in prefill
    assert p.model_label.text() != english_model and "权重" in p.model_label.text()
    assert p.title.text() == "性能"
    _switch(w, "en")
    qtbot.waitUntil(lambda: w.composer.send_button.text() == "Send", timeout=5000)
    assert "computed" in p.values["prefill"].text() and p.model_label.text() == english_model


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_demo_mode_chart_is_readable(qtbot, make_window, size):
    w = make_window()
    w.resize(*size)
    w.set_demo_mode(True)
    qtbot.wait(100)
    chart = w.panel.chart
    assert w.height() <= size[1]  # the panel's content fits the screen
    assert chart.height() >= 160
    fm = chart.fontMetrics()
    labels = grid_steps(100, int((chart.height() - 3 * fm.height()) // (2 * fm.height()))) + 1
    assert labels >= 3  # 0, a middle value and the top, with a line of space between
    w.set_demo_mode(False)


@pytest.mark.parametrize("scale", [0.5, 1, 20, 50, 100, 120, 150, 200, 250, 300, 400, 1000])
@pytest.mark.parametrize("fit", [1, 2, 3, 4, 6])
def test_grid_steps_fit_and_are_round(scale, fit):
    steps = grid_steps(scale, fit)
    assert 1 <= steps <= max(fit, 1)
    step = scale / steps
    assert steps == 1 or abs(step * 100 - round(step * 100)) < 1e-6 or step < 1
