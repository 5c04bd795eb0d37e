"""Programmatic checks that a window's text fits: no label or button clips its text, no two
visible widgets of one layout overlap. Used by tests/app/test_screens.py (and handy in a
debugger: `print(*problems(window), sep="\\n")`).

What counts as clipped:
- a QLabel that does not wrap: the widest line of its text (font metrics) is wider than its
  contents rectangle, or its line height does not fit;
- a QLabel that wraps: the height it needs at its width (heightForWidth) is more than it has;
- a QAbstractButton: its text (with its icon, if any) is wider than the button less the
  style's margins, or its text is taller than the button.
Rich-text labels are measured by their plain text. Labels and buttons that are not visible
(or have no text, or elide on purpose) are skipped. Overlap: the geometries of the visible
widgets placed by one QLayout (its nested layouts included), compared pairwise.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QAbstractButton, QLabel, QLayout, QStyle, QStyleOptionButton, QWidget

SLACK = 1  # pixels of rounding allowed


def _plain(label: QLabel) -> str:
    text = label.text()
    if label.textFormat() == Qt.RichText or (
        label.textFormat() == Qt.AutoText and GuiQt.mightBeRichText(text)
    ):
        doc = QTextDocument()
        doc.setHtml(text)
        return doc.toPlainText()
    return text


def _label_problem(label: QLabel) -> str | None:
    text = _plain(label)
    if not text.strip() or label.pixmap() is not None and not label.pixmap().isNull():
        return None
    rect = label.contentsRect()
    margin = label.margin() * 2 + label.indent() if label.indent() > 0 else label.margin() * 2
    fm = label.fontMetrics()
    if label.wordWrap():
        need = label.heightForWidth(label.width())
        if need > label.height() + SLACK:
            return f"needs {need} px of height, has {label.height()}"
        return None
    lines = text.split("\n")
    wide = max(fm.horizontalAdvance(line) for line in lines)
    if wide > rect.width() - margin + SLACK:
        return f"text {wide} px wide in {rect.width() - margin} px"
    tall = fm.height() * len(lines)
    if tall > rect.height() + SLACK:
        return f"text {tall} px tall in {rect.height()} px"
    return None


def _button_problem(button: QAbstractButton) -> str | None:
    text = button.text().replace("&&", "\0").replace("&", "").replace("\0", "&")
    if not text.strip():
        return None
    fm = button.fontMetrics()
    wide = fm.horizontalAdvance(text)
    if not button.icon().isNull():
        wide += button.iconSize().width() + 4
    opt = QStyleOptionButton()
    opt.initFrom(button)
    style = button.style()
    pad = 2 * style.pixelMetric(QStyle.PM_ButtonMargin, opt, button)
    if wide > button.width() - pad + SLACK:
        return f"text {wide} px wide in {button.width() - pad} px"
    if fm.height() > button.height() + SLACK:
        return f"text {fm.height()} px tall in {button.height()} px"
    return None


def clipped(root: QWidget) -> list[str]:
    """Every visible label and button under root whose text does not fit."""
    out = []
    for w in [root, *root.findChildren(QWidget)]:
        if not w.isVisibleTo(root) or w.width() <= 0:
            continue
        if isinstance(w, QLabel):
            why = _label_problem(w)
        elif isinstance(w, QAbstractButton):
            why = _button_problem(w)
        else:
            continue
        if why:
            out.append(f"{type(w).__name__} {w.objectName() or ''}{_plain_text(w)!r}: {why}")
    return out


def _plain_text(w) -> str:
    return (_plain(w) if isinstance(w, QLabel) else w.text())[:60]


def _layout_widgets(layout: QLayout) -> list[QWidget]:
    out = []
    for i in range(layout.count()):
        item = layout.itemAt(i)
        if item.widget() is not None:
            out.append(item.widget())
        elif item.layout() is not None:
            out.extend(_layout_widgets(item.layout()))
    return out


def overlapping(root: QWidget) -> list[str]:
    """Pairs of visible widgets of one layout whose rectangles overlap."""
    out = []
    for w in [root, *root.findChildren(QWidget)]:
        layout = w.layout()
        if layout is None or not w.isVisibleTo(root):
            continue
        kids = [k for k in _layout_widgets(layout) if k.isVisibleTo(root) and k.width() > 0]
        for i, a in enumerate(kids):
            for b in kids[i + 1 :]:
                if a.geometry().intersects(b.geometry()):
                    out.append(
                        f"{type(a).__name__} {_name(a)} {a.geometry().getRect()} overlaps "
                        f"{type(b).__name__} {_name(b)} {b.geometry().getRect()}"
                    )
    return out


def _name(w) -> str:
    if isinstance(w, (QLabel, QAbstractButton)):
        return repr(_plain_text(w))
    return w.objectName() or ""


def problems(root: QWidget) -> list[str]:
    return clipped(root) + overlapping(root)
