"""Thumbnails of the chat's images, decoded off the GUI thread.

A message's images are the user's own files (the store's copies, photos of up to 180 Mpx).
Decoding one whole on the GUI thread to show it 120 pixels high froze the window for a second
or more a picture, on sending and again on opening the chat. request() has a worker thread
decode a copy at the size shown (QImageReader's scaled decoding: a JPEG decodes straight at
1/2, 1/4 or 1/8 of its size) and calls back on the GUI thread, if the widget that asked is
still there. Finished thumbnails are kept, the least recently used dropped first, so switching
back to a chat shows them at once.

One worker, a daemon thread: thumbnails arrive in the order asked, a chat of many photos does
not take every core from an answer being generated, and quitting does not wait for the
thumbnails still queued.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, QSize, Qt, Signal
from PySide6.QtGui import QImage

from merlin.app.widgets.attachments import allow_engine_sized_images, image_reader

CACHED = 96  # thumbnails kept (120 x 360 pixels at most: 170 KB each)


def read_thumbnail(path: str, height: int, max_width: int) -> QImage | None:
    """The image at path scaled to `height` pixels (aspect kept, EXIF orientation applied),
    its left max_width pixels; None if it cannot be read. Any thread."""
    allow_engine_sized_images()
    try:
        reader = image_reader(path)
    except OSError:
        return None
    size = reader.size()
    if size.isValid() and min(size.width(), size.height()) > height:
        # decoded with its shorter side at `height`: enough whichever way EXIF turns it
        scale = height / min(size.width(), size.height())
        reader.setScaledSize(
            QSize(max(1, round(size.width() * scale)), max(1, round(size.height() * scale)))
        )
    image = reader.read()
    if image.isNull():
        return None
    if image.height() != height and image.height() > 0:
        image = image.scaledToHeight(height, Qt.SmoothTransformation)
    if image.width() > max_width:
        image = image.copy(0, 0, max_width, image.height())
    return image


class _Thumbnails(QObject):
    _sig_done = Signal(object, object)  # key, QImage or None

    def __init__(self):
        super().__init__()
        self._queue: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        threading.Thread(target=self._work, name="merlin-thumbnails", daemon=True).start()
        self._cache: OrderedDict[tuple, QImage] = OrderedDict()
        self._waiting: dict[tuple, list] = {}  # key -> [(receiver, callback)]
        self._sig_done.connect(self._deliver, Qt.QueuedConnection)

    def request(
        self,
        path: str,
        height: int,
        max_width: int,
        receiver: QObject,
        done: Callable[[QImage | None], None],
    ) -> None:
        key = (path, height, max_width)
        if key in self._cache:
            self._cache.move_to_end(key)
            done(self._cache[key])
            return
        if key in self._waiting:  # already being read: one more to tell
            self._waiting[key].append((receiver, done))
            return
        self._waiting[key] = [(receiver, done)]
        self._queue.put(key)

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            try:
                image = read_thumbnail(*key)
            except Exception:  # noqa: BLE001 (a file that breaks the decoder shows as missing)
                image = None
            with contextlib.suppress(RuntimeError):  # the application is gone: nobody to tell
                self._sig_done.emit(key, image)

    def _deliver(self, key: tuple, image) -> None:
        if image is not None:  # a missing file is looked for again next time
            self._cache[key] = image
            while len(self._cache) > CACHED:
                self._cache.popitem(last=False)
        for receiver, done in self._waiting.pop(key, []):
            if shiboken6.isValid(receiver):
                done(image)

    def wait(self) -> None:
        """Until every thumbnail asked for is delivered (screenshots, tests)."""
        while self._waiting:
            QCoreApplication.processEvents()
            time.sleep(0.005)


_instance: _Thumbnails | None = None


def thumbnails() -> _Thumbnails:
    """The process's one thumbnail reader (made on first use, on the GUI thread)."""
    global _instance
    if _instance is None:
        _instance = _Thumbnails()
    return _instance
