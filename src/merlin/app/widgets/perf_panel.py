"""The live performance panel: where each forward's time goes, speed, memory, speculation.

The chart is drawn with QPainter (a few hundred rectangles), repainted at most a few times a
second and only when new data arrived; it measures its own repaint time (shown at the foot of
the panel, and read by the tests).
"""

from __future__ import annotations

import math
import re
import time

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QPainter, QPalette, QPen
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from merlin.app.i18n import tr
from merlin.app.model.perf_stats import (
    HISTORY,
    PerfStats,
    format_bytes,
    format_ms,
    machine_memory_bytes,
    process_memory_bytes,
)
from merlin.app.widgets import theme

REFRESH_MS = 250  # the panel updates 4 times a second


def chart_scale(totals: list[float]) -> float:
    """The chart's top in ms: room for nearly every forward, not for a rare stall."""
    if not totals:
        return 1.0
    ordered = sorted(totals)
    median = ordered[len(ordered) // 2]
    typical = min(ordered[min(len(ordered) - 1, int(len(ordered) * 0.97))], median * 6)
    return _nice_ceiling(max(typical, median * 2) * 1.1)


def grid_steps(scale: float, fit: int) -> int:
    """How many intervals to split the axis 0..scale into: at most `fit` (the labels that fit
    with a line of space between them), preferring steps that are round numbers."""
    for steps in (4, 5, 3, 2):
        if steps <= fit and _is_round(scale / steps):
            return steps
    return 1


def _is_round(x: float) -> bool:
    """x is a round mantissa (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 7.5, 8) times a power of ten."""
    if x <= 0:
        return False
    exp = math.floor(math.log10(x))
    m = x / 10**exp
    return any(abs(m - r) < 1e-6 for r in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 7.5, 8, 10))


def _nice_ceiling(x: float) -> float:
    if x <= 0:
        return 1.0
    exp = math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * 10**exp >= x:
            return m * 10**exp
    return 10 ** (exp + 1)


# between two CJK characters (Chinese breaks a line between any two): where a word joiner goes
_CJK_PAIR = re.compile(r"(?<=[\u3400-\u9fff])(?=[\u3400-\u9fff])")


class StackedChart(QWidget):
    """ms per forward for the last HISTORY forwards: gemm / attention / other stacked."""

    def __init__(self, stats: PerfStats, parent=None):
        super().__init__(parent)
        self.stats = stats
        self.paint_ms = 0.0  # moving average of paintEvent time
        self.paint_max_ms = 0.0
        self.paints = 0
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self.setMinimumHeight(120)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(320, 180)

    def paintEvent(self, event):  # noqa: N802
        t0 = time.perf_counter()
        p = QPainter(self)
        pal = self.palette()
        rect = QRectF(self.rect())
        p.fillRect(rect, pal.color(QPalette.Base))
        fm = p.fontMetrics()
        left = fm.horizontalAdvance("0000.0") + 6
        top = fm.height() + 4
        plot = rect.adjusted(left, top, -6, -fm.height() - 8)
        history = list(self.stats.history)
        scale = chart_scale([f.total_ms for f in history])
        text = pal.color(QPalette.Text)
        grid = theme.mix(pal.color(QPalette.Base), text, 0.15)
        p.setPen(QPen(grid, 1))
        # as many grid lines as fit with a line of text between labels (never overlapping)
        steps = grid_steps(scale, int(plot.height() // (2 * fm.height())))
        for i in range(steps + 1):
            y = plot.bottom() - plot.height() * i / steps
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            p.setPen(text)
            value = scale * i / steps
            label = f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.3g}"
            p.drawText(
                QRectF(0, y - fm.height() / 2, left - 4, fm.height()),
                Qt.AlignRight | Qt.AlignVCenter,
                label,
            )
            p.setPen(QPen(grid, 1))
        p.setPen(text)
        p.drawText(
            QRectF(plot.left(), rect.bottom() - fm.height() - 2, plot.width(), fm.height()),
            Qt.AlignCenter,
            tr("ms per forward · last {n}").format(n=HISTORY),
        )
        # bars, newest at the right; one drawRects call per series. A forward taller than the
        # scale (a one-off stall) is cut at the top and marked, so it cannot flatten the rest.
        bar_w = plot.width() / HISTORY
        h_per_ms = plot.height() / scale
        x0 = plot.right() - len(history) * bar_w
        w = max(1.0, bar_w - (1 if bar_w >= 3 else 0))
        gemm, attn, other, cut, spec = [], [], [], [], []
        top = plot.top()
        for i, f in enumerate(history):
            x = x0 + i * bar_w
            y = plot.bottom()
            for ms, out in ((f.gemm_ms, gemm), (f.attn_ms, attn), (f.other_ms, other)):
                h = ms * h_per_ms
                if h <= 0 or y <= top:
                    continue
                h = min(h, y - top)
                y -= h
                out.append(QRectF(x, y, w, h))
            if f.total_ms > scale:
                cut.append(QRectF(x, top - 3, w, 3))
            elif f.emitted > 1:  # a speculative forward that accepted drafts
                spec.append(QRectF(x, plot.bottom() - f.total_ms * h_per_ms - 3, w, 2))
        p.setPen(Qt.NoPen)
        for color, rects in (
            (theme.GEMM, gemm),
            (theme.ATTN, attn),
            (theme.OTHER, other),
            (theme.SPEC, spec),
            (text, cut),
        ):
            if rects:
                p.setBrush(color)
                p.drawRects(rects)
        # legend
        x = plot.left()
        for color, name in (
            (theme.GEMM, tr("GEMM")),
            (theme.ATTN, tr("attention")),
            (theme.OTHER, tr("other")),
        ):
            p.setBrush(color)
            p.setPen(Qt.NoPen)
            s = fm.ascent() - 2
            p.drawRect(QRectF(x, 2 + (fm.height() - s) / 2, s, s))
            p.setPen(text)
            p.drawText(QPointF(x + s + 4, 2 + fm.ascent()), name)
            x += s + 4 + fm.horizontalAdvance(name) + 14
        if not history:
            p.setPen(theme.muted_text(pal))
            p.drawText(plot, Qt.AlignCenter, tr("Ask something to see where the time goes."))
        p.end()
        ms = (time.perf_counter() - t0) * 1e3
        self.paints += 1
        self.paint_max_ms = max(self.paint_max_ms, ms)
        self.paint_ms = ms if self.paints == 1 else 0.8 * self.paint_ms + 0.2 * ms


class PerfPanel(QFrame):
    """The panel beside the chat. Call refresh() or let its timer do it while visible."""

    METRICS = (
        "rate",
        "ttft",
        "vision",
        "prefill",
        "context",
        "kv",
        "memory",
        "split",
        "bandwidth",
        "experts",
    )
    SPEC_METRICS = ("spec_mode", "spec_tries", "spec_hits", "spec_rolls", "spec_rate", "spec_tpf")

    def __init__(self, stats: PerfStats, parent=None):
        super().__init__(parent)
        self.stats = stats
        self.setFrameShape(QFrame.NoFrame)
        self.setObjectName("perfPanel")
        self.setAutoFillBackground(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(6)
        self.title = QLabel()
        f = self.title.font()
        f.setBold(True)
        self.title.setFont(f)
        layout.addWidget(self.title)
        self.model_label = QLabel()
        self.model_label.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.model_label.setWordWrap(True)
        self.model_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setMinimumWidth(260)  # its values in two lines at most, also in Chinese
        layout.addWidget(self.model_label)
        self.chart = StackedChart(stats)
        layout.addWidget(self.chart, 3)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(3)
        self.names: dict[str, QLabel] = {}
        self.values: dict[str, QLabel] = {}
        row = 0
        for key in self.METRICS:
            self._add_metric(grid, row, key)
            row += 1
        self.spec_title = QLabel()
        sf = self.spec_title.font()
        sf.setBold(True)
        self.spec_title.setFont(sf)
        grid.addWidget(self.spec_title, row, 0, 1, 2)
        row += 1
        for key in self.SPEC_METRICS:
            self._add_metric(grid, row, key)
            row += 1
        grid.setColumnStretch(1, 1)
        layout.addLayout(grid)
        self.grid = grid
        self.footer = QLabel()
        self.footer.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.footer.setWordWrap(True)  # a narrow panel wraps it, never clips it
        self.footer.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        pal = self.footer.palette()
        pal.setColor(QPalette.WindowText, theme.muted_text())
        self.footer.setPalette(pal)
        layout.addWidget(self.footer)
        self._seen = -1
        self._encoder = ""  # the vision encoder's progress or time (app/image_encoding.py)
        self._encoder_since = self._encoder_answer = None  # set_encoder
        self._memory = 0
        self._ram: int | None = None  # the machine's RAM (read once)
        self._ticks = 0
        self.timer = QTimer(self, interval=REFRESH_MS)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()
        self.retranslate()

    def _add_metric(self, grid: QGridLayout, row: int, key: str) -> None:
        name, value = QLabel(), QLabel("–")
        # a value that grows while an answer streams must not widen the panel (the splitter
        # would follow it and squeeze the chat): values ask for no width of their own and wrap
        # onto a second line when the panel is narrow, so they are never clipped either
        value.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        value.setWordWrap(True)
        value.setTextInteractionFlags(Qt.TextSelectableByMouse)
        value.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        value.setFont(theme.monospace_font())
        grid.addWidget(name, row, 0)
        grid.addWidget(value, row, 1)
        self.names[key], self.values[key] = name, value

    # ---- updating ------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        if not self.isVisible() and not force:
            return
        self._ticks += 1
        if force or self._ticks % 4 == 1:
            self._memory = process_memory_bytes()
            self._ram = machine_memory_bytes() if self._ram is None else self._ram
            self.values["memory"].setText(memory_text(self._memory, self._ram, self.stats.kv_bytes))
        if not force and self.stats.generation == self._seen:
            return
        self._seen = self.stats.generation
        s = self.stats
        cur, avg = s.current_tokens_per_s, s.decode_tokens_per_s
        self.values["rate"].setText(f"{_num(cur)} / {_num(avg)}" if cur or avg else "–")
        self.values["ttft"].setText(format_ms(s.ttft_ms))
        vision = format_ms(s.vision_ms) if s.vision_ms else "–"
        self.values["vision"].setText(self._encoder_text() or vision)
        if s.prefill_tokens or s.reused_tokens:
            # computed: rows prefilled now; reused: rows the session's KV cache already held
            pre = tr("{ms} · computed {n} / reused {r} tok").format(
                ms=format_ms(s.prefill_ms), n=s.prefill_tokens, r=s.reused_tokens
            )
            # a narrow panel wraps at the dot, never between a number and its word (nor
            # inside a Chinese word: a word joiner between its characters)
            pre = (
                pre.replace(" ", "\u00a0")
                .replace("\u00a0·\u00a0", " · ")
                .replace("\u00a0/\u00a0", " / ")
            )
            pre = _CJK_PAIR.sub("\u2060", pre)
        else:
            pre = "–"
        self.values["prefill"].setText(pre)
        self.values["context"].setText(str(s.context) if s.context else "–")
        self.values["kv"].setText(format_bytes(s.kv_bytes) if s.kv_bytes else "–")
        split = s.split_percent()
        self.values["split"].setText(
            f"{split[0]:.0f}% / {split[1]:.0f}% / {split[2]:.0f}%" if split else "–"
        )
        self.values["bandwidth"].setText(f"{s.gb_per_s:.1f} GB/s" if s.gb_per_s else "–")
        self.values["experts"].setText(
            f"{s.experts_read} · {format_bytes(s.weight_bytes)}" if s.experts_read else "–"
        )
        # a mixture-of-experts figure: a dense model's row would only ever say "–"
        self.names["experts"].setVisible(bool(s.experts_read))
        self.values["experts"].setVisible(bool(s.experts_read))
        spec = s.spec
        mode = s.spec_mode or "–"
        if s.spec_k and s.spec_mode and s.spec_mode != "off":
            mode = f"{s.spec_mode}, K={s.spec_k}"
        self.values["spec_mode"].setText(mode)
        self.values["spec_tries"].setText(_count(spec.get("tries"), spec.get("drafted")))
        self.values["spec_hits"].setText(_count(spec.get("hits")))
        self.values["spec_rolls"].setText(_count(spec.get("kv_rolls")))
        rate = spec.get("hit_rate")
        self.values["spec_rate"].setText(f"{rate * 100:.0f}%" if isinstance(rate, float) else "–")
        tpf = spec.get("tokens_per_forward")
        self.values["spec_tpf"].setText(f"{tpf:.2f}" if isinstance(tpf, (int, float)) else "–")
        self.chart.update()
        self._update_footer()

    def _update_footer(self) -> None:
        self.footer.setText(
            tr("chart repaint {avg:.2f} ms (max {peak:.2f} ms)").format(
                avg=self.chart.paint_ms, peak=self.chart.paint_max_ms
            )
        )

    def set_demo_mode(self, on: bool) -> None:
        """Demo mode (large text on a 720p screen): the chart keeps a readable height; the
        rows close up and the repaint footer (a figure for developers) is hidden."""
        self.chart.setMinimumHeight(160 if on else 120)
        self.grid.setVerticalSpacing(0 if on else 3)
        self.footer.setVisible(not on)

    def set_encoder(self, text: str) -> None:
        """The vision encoder's line: blocks done of depth while it runs, its time after. It
        stays through the answer that starts next (the picture's), then that line is each
        answer's own figure again (a later text-only answer had kept showing it)."""
        self._encoder = text
        self._encoder_since = self.stats.started_at  # the answer running or last run then
        self._encoder_answer = None  # the answer that starts next
        self.values["vision"].setText(text or "–")

    def _encoder_text(self) -> str:
        start = self.stats.started_at
        if self._encoder and start != self._encoder_since:
            if self._encoder_answer is None:
                self._encoder_answer = start
            elif start != self._encoder_answer:
                self._encoder = ""
        return self._encoder

    def set_model(self, text: str) -> None:
        self.model_label.setText(text)

    def set_memory_note(self, text: str) -> None:
        """What the memory line's figure holds besides the usual (its tooltip; "": nothing)."""
        self.values["memory"].setToolTip(text)

    # ---- language ------------------------------------------------------------------------

    def retranslate(self) -> None:
        self.title.setText(tr("Performance"))
        names = {
            "rate": tr("Tokens/s (now / avg)"),
            "ttft": tr("Time to first token"),
            "vision": tr("Vision encoder"),
            "prefill": tr("Prefill"),
            "context": tr("Context (tokens)"),
            "kv": tr("KV cache memory"),
            "memory": tr("Memory"),
            "split": tr("GEMM / attention / other"),
            "bandwidth": tr("Weights + KV read"),
            "experts": tr("Experts / weights read per forward"),
            "spec_mode": tr("Mode"),
            "spec_tries": tr("Tries (drafted)"),
            "spec_hits": tr("Accepted drafts"),
            "spec_rolls": tr("KV rollbacks"),
            "spec_rate": tr("Hit rate"),
            "spec_tpf": tr("Tokens per forward"),
        }
        for key, label in self.names.items():
            label.setText(names[key])
        self.spec_title.setText(tr("Speculative decoding"))
        if hasattr(self, "_seen"):  # values hold translated words too (the Prefill line)
            self.refresh(force=True)
        self.chart.update()

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)


def memory_text(rss: int, ram: int | None, kv: int) -> str:
    """The memory line: "1.2 GB of 16.0 GB; KV 96.0 MB" (the process's resident memory, the
    machine's RAM, the KV cache's rows). Each figure keeps its unit on its line (no-break
    spaces), so a narrow panel wraps between the parts, never inside one."""

    def nb(n: int) -> str:
        return format_bytes(n).replace(" ", "\u00a0")

    text = nb(rss)
    if ram:
        text = tr("{rss} of {ram}").format(rss=text, ram=nb(ram))
    if kv:
        text = tr("{memory}; KV {kv}").format(memory=text, kv=nb(kv)).replace("KV ", "KV\u00a0")
    return text


def _num(x) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) and x else "–"


def _count(x, extra=None) -> str:
    if x is None:
        return "–"
    return f"{x} ({extra})" if extra is not None else str(x)
