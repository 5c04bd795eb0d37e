"""Performance statistics from engine events (Qt-free) and the chart's scale."""

from merlin.app.model.perf_stats import PerfStats, format_bytes, process_memory_bytes
from merlin.app.widgets.perf_panel import chart_scale
from merlin.engine.profile import StepProfile


def prof(step, ms=4.0, n=1, spec=None):
    return StepProfile(
        step=step,
        context=100 + step,
        n_tokens=n,
        emitted=1,
        gemm_ms=ms * 0.7,
        attn_ms=ms * 0.2,
        other_ms=ms * 0.1,
        total_ms=ms,
        weight_bytes=10**6,
        kv_bytes=1000 * (100 + step),
        spec=spec or {},
    )


def test_stats_follow_an_answer():
    s = PerfStats()
    s.start(10.0)
    s.prefill(100, 50.0, 200.0)
    s.tokens_event([1], prof(0, ms=200.0, n=100), 10.3)  # the prefill forward: not charted
    for i in range(1, 11):
        s.tokens_event([i], prof(i), 10.3 + i * 0.01)
    s.tokens_event([], prof(11), 10.5)  # detokenizer tail: ignored
    assert abs(s.ttft_ms - 300.0) < 1e-6
    assert s.tokens == 11 and len(s.history) == 10
    assert abs(s.current_tokens_per_s - 250.0) < 1e-6
    assert abs(s.decode_tokens_per_s - 100.0) < 1e-6
    g, a, o = s.split_percent()
    assert round(g) == 70 and round(a) == 20 and round(o) == 10
    assert s.context == 110 and s.kv_bytes == 110_000
    s.finished("stop_token", 123.0)
    assert not s.running and s.decode_tokens_per_s == 123.0


def test_spec_stats_are_kept():
    s = PerfStats()
    s.start(0.0)
    spec = {
        "tries": 3,
        "drafted": 12,
        "hits": 7,
        "kv_rolls": 2,
        "hit_rate": 0.58,
        "tokens_per_forward": 2.3,
    }
    s.tokens_event([1, 2, 3], prof(1, spec=spec), 0.1)
    assert s.spec["hits"] == 7 and s.history[-1].emitted == 3


def test_history_is_bounded_and_chart_scale_ignores_a_stall():
    s = PerfStats()
    for i in range(500):
        s.tokens_event([i], prof(i, ms=5.0), i * 0.01)
    assert len(s.history) == 200
    totals = [5.0] * 199 + [400.0]
    assert chart_scale(totals) <= 20  # one 400 ms stall does not flatten 199 bars
    assert chart_scale([]) == 1.0


def test_memory_figures():
    assert process_memory_bytes() > 10 * 2**20
    assert format_bytes(512) == "512 B" and format_bytes(3 * 2**30) == "3.0 GB"
