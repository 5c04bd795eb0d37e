"""A picture for the scripted demo (--demo-screenshot), drawn by the project with QPainter."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QLinearGradient, QPainter, QPainterPath, QPolygonF


def draw_demo_image(path: Path | str, width: int = 640, height: int = 420) -> Path:
    """A landscape: sky, sun, two mountains, a lake and a small boat. Saved as PNG."""
    image = QImage(width, height, QImage.Format_RGB32)
    p = QPainter(image)
    p.setRenderHint(QPainter.Antialiasing)
    sky = QLinearGradient(0, 0, 0, height * 0.6)
    sky.setColorAt(0, QColor("#3A6EA5"))
    sky.setColorAt(1, QColor("#F6C28B"))
    p.fillRect(QRectF(0, 0, width, height), sky)
    p.setPen(Qt.NoPen)
    p.setBrush(QColor("#FFE08A"))
    p.drawEllipse(QPointF(width * 0.72, height * 0.3), height * 0.09, height * 0.09)
    for color, pts in (
        ("#5B6C8F", [(0.0, 0.62), (0.28, 0.22), (0.55, 0.62)]),
        ("#46557A", [(0.35, 0.62), (0.68, 0.3), (1.0, 0.62)]),
    ):
        p.setBrush(QColor(color))
        p.drawPolygon(QPolygonF([QPointF(x * width, y * height) for x, y in pts]))
    p.setBrush(QColor("#FFFFFF"))
    p.drawPolygon(
        QPolygonF(
            [QPointF(width * x, height * y) for x, y in ((0.28, 0.22), (0.24, 0.3), (0.32, 0.3))]
        )
    )
    lake = QLinearGradient(0, height * 0.6, 0, height)
    lake.setColorAt(0, QColor("#2F5E8A"))
    lake.setColorAt(1, QColor("#1B3A5A"))
    p.fillRect(QRectF(0, height * 0.62, width, height * 0.38), lake)
    boat = QPainterPath()
    boat.moveTo(width * 0.40, height * 0.78)
    boat.lineTo(width * 0.52, height * 0.78)
    boat.lineTo(width * 0.49, height * 0.82)
    boat.lineTo(width * 0.43, height * 0.82)
    boat.closeSubpath()
    p.setBrush(QColor("#8B4A2B"))
    p.drawPath(boat)
    p.setBrush(QColor("#F2F2F2"))
    p.drawPolygon(
        QPolygonF(
            [
                QPointF(width * 0.46, height * 0.77),
                QPointF(width * 0.46, height * 0.64),
                QPointF(width * 0.51, height * 0.77),
            ]
        )
    )
    p.end()
    path = Path(path)
    image.save(str(path), "PNG")
    return path
