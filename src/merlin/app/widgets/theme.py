"""Colours and fonts derived from the system palette, so light and dark desktops both work."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication

from merlin.app import pyside_fixes

# chart series: distinguishable in light and dark, and for common colour blindness
GEMM = QColor("#4C78A8")
ATTN = QColor("#F58518")
OTHER = QColor("#9A9A9A")
SPEC = QColor("#54A24B")


def palette() -> QPalette:
    return QApplication.palette()


def is_dark(pal: QPalette | None = None) -> bool:
    pal = pal or palette()
    return pal.color(QPalette.Window).lightness() < 128


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """a blended towards b by t (0..1)."""
    return QColor(
        round(a.red() + (b.red() - a.red()) * t),
        round(a.green() + (b.green() - a.green()) * t),
        round(a.blue() + (b.blue() - a.blue()) * t),
    )


def user_bubble(pal: QPalette | None = None) -> QColor:
    pal = pal or palette()
    return mix(pal.color(QPalette.Base), pal.color(QPalette.Highlight), 0.12)


def drafted_background(pal: QPalette | None = None) -> QColor:
    """Behind answer text that came from accepted speculative drafts (the panel's SPEC hue)."""
    pal = pal or palette()
    return mix(pal.color(QPalette.Base), SPEC, 0.3)


def code_background(pal: QPalette | None = None) -> QColor:
    pal = pal or palette()
    return mix(pal.color(QPalette.Base), pal.color(QPalette.Text), 0.07)


def muted_text(pal: QPalette | None = None) -> QColor:
    pal = pal or palette()
    return mix(pal.color(QPalette.Text), pal.color(QPalette.Base), 0.45)


def banner_colors(kind: str, pal: QPalette | None = None) -> tuple[QColor, QColor]:
    """(background, border) for info / warning / error banners."""
    pal = pal or palette()
    accent = {
        "info": pal.color(QPalette.Highlight),
        "warning": QColor("#D99A00"),
        "error": QColor("#D0393E"),
    }.get(kind, pal.color(QPalette.Highlight))
    base = pal.color(QPalette.Base)
    return mix(base, accent, 0.16 if not is_dark(pal) else 0.28), accent


def monospace_font(size_pt: float | None = None) -> QFont:
    font = QFont("DejaVu Sans Mono")
    font.setStyleHint(QFont.Monospace)
    font.setFixedPitch(True)
    if size_pt:
        font.setPointSizeF(size_pt)
    return font


def scaled_font(base: QFont, factor: float) -> QFont:
    font = QFont(base)
    font.setPointSizeF(max(6.0, base.pointSizeF() * factor))
    return font


pyside_fixes.install()  # every widget module imports this one first
