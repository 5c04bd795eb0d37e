"""The performance panel: receives real profiles, shows speculative decoding statistics,
and repaints cheaply (the measured cost is printed)."""

import time

from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)

from merlin.app.model.perf_stats import PerfStats
from merlin.engine.generate import Tokens
from merlin.engine.profile import StepProfile


def test_panel_receives_profiles_from_the_engine(qtbot, make_window):
    w = make_window(max_new_tokens=40)
    send(qtbot, w, "Hello")
    s = w.stats
    assert len(s.history) >= 10 and s.ttft_ms and s.prefill_tokens > 0
    w.panel.refresh(force=True)
    v = w.panel.values
    assert v["rate"].text() != "–" and "ms" in v["ttft"].text()
    assert v["context"].text().isdigit() and "KB" in v["kv"].text() or "MB" in v["kv"].text()
    assert "%" in v["split"].text()
    assert " of " in v["memory"].text() and "; KV\u00a0" in v["memory"].text()
    assert v["spec_mode"].text().startswith("auto")
    qtbot.waitUntil(lambda: w.panel.chart.paints > 0, timeout=5000)


def test_panel_shows_speculative_statistics(qtbot, make_window):
    w = make_window()
    c = w.controller
    send(qtbot, w, "Hello", wait=False)
    job = c.answer.job.job_id
    spec = {
        "tries": 5,
        "drafted": 20,
        "hits": 13,
        "kv_rolls": 3,
        "hit_rate": 0.65,
        "tokens_per_forward": 2.6,
    }
    profile = StepProfile(
        step=3,
        context=40,
        n_tokens=5,
        emitted=4,
        gemm_ms=3.0,
        attn_ms=1.0,
        other_ms=0.5,
        total_ms=4.5,
        spec=spec,
    )
    c.on_event(job, Tokens(text=" spec", ids=[1, 2, 3, 4], profile=profile))
    w.panel.refresh(force=True)
    v = w.panel.values
    assert v["spec_tries"].text() == "5 (20)" and v["spec_hits"].text() == "13"
    assert v["spec_rolls"].text() == "3" and v["spec_rate"].text() == "65%"
    assert v["spec_tpf"].text() == "2.60"
    c.stop()
    qtbot.waitUntil(lambda: not c.busy, timeout=60_000)


def test_chart_repaint_cost(qtbot):
    from merlin.app.widgets.perf_panel import PerfPanel

    stats = PerfStats()
    for i in range(400):
        p = StepProfile(
            step=i,
            context=i,
            n_tokens=1,
            emitted=1 + (i % 7 == 0),
            gemm_ms=20 + i % 5,
            attn_ms=3 + i % 3,
            other_ms=2,
            total_ms=25 + i % 8,
        )
        stats.tokens_event([i], p, i * 0.03)
    panel = PerfPanel(stats)
    qtbot.addWidget(panel)
    panel.resize(420, 640)
    panel.show()
    qtbot.waitExposed(panel)
    panel.refresh(force=True)
    chart = panel.chart
    chart.grab()  # first paint loads fonts: not counted
    assert chart.paints >= 1, (chart.isVisible(), chart.size())
    times = []
    for _ in range(60):
        t0 = time.perf_counter()
        chart.grab()  # paintEvent into an offscreen pixmap, as a screen update would
        times.append((time.perf_counter() - t0) * 1e3)
    assert chart.paints >= 61
    times.sort()
    median = times[len(times) // 2]
    print(
        f"\nperf chart repaint, 200 forwards at {chart.width()}x{chart.height()}: "
        f"median {median:.2f} ms, max {times[-1]:.2f} ms, paintEvent avg {chart.paint_ms:.2f} ms"
    )
    assert median < 8.0  # a few Hz of this is far below 1% of a core


def test_the_encoder_line_belongs_to_the_next_answer_only(qtbot):
    """A picture encoded while the question was typed shows its encoder time (in ms, as the
    panel's other times: it had read "0.01 s") through the answer that follows; a later
    text-only answer shows its own figure again (the old time had stayed)."""
    from merlin.app.model.perf_stats import format_ms
    from merlin.app.widgets.perf_panel import PerfPanel

    stats = PerfStats()
    panel = PerfPanel(stats)
    qtbot.addWidget(panel)
    stats.start(1.0)  # an earlier answer
    panel.set_encoder(format_ms(6.4))
    panel.refresh(force=True)
    assert panel.values["vision"].text() == "6 ms"
    stats.start(2.0)  # the picture's answer: it was encoded before, its own figure is 0
    stats.prefill(10, 0.0, 5.0)
    panel.refresh(force=True)
    assert panel.values["vision"].text() == "6 ms"
    stats.start(3.0)  # a text-only answer after it
    stats.prefill(10, 0.0, 5.0)
    panel.refresh(force=True)
    assert panel.values["vision"].text() == "–"


def test_a_chinese_prefill_line_never_breaks_inside_a_word(qtbot):
    from merlin.app.i18n import shared_translations
    from merlin.app.widgets.perf_panel import PerfPanel

    translations = shared_translations()
    assert translations.switch("zh_CN")
    try:
        stats = PerfStats()
        panel = PerfPanel(stats)
        qtbot.addWidget(panel)
        stats.start(1.0)
        stats.prefill(12, 0.0, 5.0, reused=291)
        panel.refresh(force=True)
        text = panel.values["prefill"].text()
        assert "291" in text and "词\u2060元" in text
    finally:
        translations.switch("en")
