"""Icons: the project's own SVGs (resources/icons), drawn in the palette's text colour."""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

from merlin.app import pyside_fixes
from merlin.app.model.paths import icon_path

SIZES = (16, 20, 24, 32, 48, 64)


@lru_cache(maxsize=256)
def _icon(name: str, color: str, disabled: str) -> QIcon:
    path = icon_path(name)
    icon = QIcon()
    if not path.is_file():
        return icon
    svg = path.read_text(encoding="utf-8")
    for mode, fill in ((QIcon.Normal, color), (QIcon.Disabled, disabled)):
        renderer = QSvgRenderer(QByteArray(svg.replace("currentColor", fill).encode()))
        for size in SIZES:
            pm = QPixmap(size, size)
            pm.fill(Qt.transparent)
            p = QPainter(pm)
            p.setRenderHint(QPainter.Antialiasing)
            renderer.render(p, QRectF(0, 0, size, size))
            p.end()
            icon.addPixmap(pm, mode)
    return icon


def icon(name: str) -> QIcon:
    pal = QApplication.palette()
    return _icon(
        name,
        pal.color(QPalette.Active, QPalette.ButtonText).name(),
        pal.color(QPalette.Disabled, QPalette.ButtonText).name(),
    )


def app_icon() -> QIcon:
    path = icon_path("merlin")
    return QIcon(str(path)) if path.is_file() else QIcon()


pyside_fixes.install()  # every widget module imports this one first
