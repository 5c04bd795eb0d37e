"""Work that would freeze the window (reading and writing big files) on a thread of its own,
its outcome delivered on the GUI thread.

    job = BackgroundJob(parent, work, done, failed)

runs work() on a Python thread; then, on the GUI thread through a queued signal, done(result)
or failed(exception) runs exactly once and its return value is job.result. wait() joins the
thread and delivers at once (a window closing, tests). An exception failed() does not handle
(it returns NotImplemented) is raised on the GUI thread, as if the work had run there.

Plain threading rather than QThread: the work calls no Qt, and a Python thread needs no event
loop of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal


class BackgroundJob(QObject):
    _sig_over = Signal()

    def __init__(
        self,
        parent: QObject,
        work: Callable[[], object],
        done: Callable[[object], object],
        failed: Callable[[BaseException], object],
        name: str = "merlin-background",
    ):
        super().__init__(parent)
        self._work, self._done, self._failed = work, done, failed
        self._outcome: tuple[bool, object] | None = None
        self._delivered = False
        self.result = None
        self._sig_over.connect(self._deliver, Qt.QueuedConnection)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Not yet delivered (the work may be over, its outcome still queued)."""
        return not self._delivered

    def _run(self) -> None:
        try:
            self._outcome = (True, self._work())
        except BaseException as e:  # delivered to failed() on the GUI thread
            self._outcome = (False, e)
        with contextlib.suppress(RuntimeError):  # the parent is gone: nobody to tell
            self._sig_over.emit()

    def _deliver(self) -> None:
        if self._delivered or self._outcome is None:
            return
        self._delivered = True
        (ok, value), done, failed = self._outcome, self._done, self._failed
        # what the work held (a pasted image's bytes, a file's rows) goes with the job's end
        self._outcome = self._work = self._done = self._failed = None
        if ok:
            self.result = done(value)
            return
        result = failed(value)
        if result is NotImplemented:
            raise value
        self.result = result

    def wait(self, timeout: float | None = None):
        """Block until the work is over (or `timeout` seconds passed: then None, nothing
        delivered), deliver its outcome now (if not yet), return result."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        self._deliver()
        return self.result
