"""The panel's memory line through the real window: the process's resident memory against
the machine's RAM and the KV cache's bytes ("1.2 GB of 16.0 GB; KV 96.0 MB"), plausible
numbers read the way engine/memory.py reads them, refreshed with the panel."""

from __future__ import annotations

import re

from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)

from merlin.app.widgets.perf_panel import memory_text
from merlin.engine import memory

UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30}
LINE = re.compile(r"^([\d.]+) (B|KB|MB|GB) of ([\d.]+) (GB|MB); KV ([\d.]+) (B|KB|MB|GB)$")


def _bytes(number: str, unit: str) -> float:
    return float(number) * UNITS[unit]


def test_memory_line_shows_process_ram_and_kv(qtbot, make_window):
    w = make_window()
    send(qtbot, w, "hello there")
    w.panel.refresh(force=True)
    text = w.panel.values["memory"].text().replace("\u00a0", " ")
    m = LINE.match(text)
    assert m, text
    rss, ram, kv = _bytes(*m.group(1, 2)), _bytes(*m.group(3, 4)), _bytes(*m.group(5, 6))
    real_rss, real_ram = memory.resident_memory(), memory.total_memory()
    assert 50 * 2**20 < rss < ram  # Qt, NumPy and a model: tens of MB at least
    assert abs(rss - real_rss) < 0.2 * real_rss  # what the process really holds
    assert abs(ram - real_ram) <= 0.06 * real_ram  # one decimal of rounding
    # the KV cache holds the conversation's rows: context tokens x bytes per token
    s = w.stats
    assert s.kv_bytes > 0 and s.context > 0 and abs(kv - s.kv_bytes) <= 0.06 * s.kv_bytes
    assert kv < rss


def test_memory_text_forms():
    def text(*args):
        out = memory_text(*args)
        assert "KV " not in out and not any(f" {u}" in out for u in UNITS)  # never split there
        return out.replace("\u00a0", " ")

    assert text(1288490189, 16 * 2**30, 96 * 2**20) == "1.2 GB of 16.0 GB; KV 96.0 MB"
    assert text(300 * 2**20, None, 0) == "300.0 MB"  # nothing known of RAM, no cache
    assert text(300 * 2**20, 8 * 2**30, 0) == "300.0 MB of 8.0 GB"


def test_total_memory_is_the_machines():
    total = memory.total_memory()
    assert total is not None and total > memory.resident_memory() > 0
    with open("/proc/meminfo") as f:
        mem_total = int(next(x for x in f if x.startswith("MemTotal:")).split()[1]) * 1024
    assert total <= mem_total


def test_the_kv_figure_follows_the_chat_shown(qtbot, make_window):
    w = make_window()
    send(qtbot, w, "hello there")
    meter = w.controller.meter

    def counted():
        qtbot.waitUntil(lambda: not meter.timer.isActive(), timeout=5000)
        qtbot.waitUntil(lambda: meter.last is not None and meter.last.serial == meter.serial,
                        timeout=30_000)  # fmt: skip
        w.panel.refresh(force=True)
        return meter.last

    r = counted()
    held = r.kv_bytes
    assert held > 0 and w.stats.kv_bytes == held  # what the engine session holds
    chat = w.controller.current_id
    w.controller.new_conversation()
    assert counted().kv_bytes == 0 and w.stats.kv_bytes == 0
    assert "KV" not in w.panel.values["memory"].text() and w.panel.values["kv"].text() == "–"
    w.controller.open_conversation(chat)  # its saved session is restored
    assert counted().kv_bytes == held and w.stats.kv_bytes == held
    assert "KV" in w.panel.values["memory"].text()
