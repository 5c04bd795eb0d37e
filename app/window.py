"""Main window: chat view, composer, status line. The full app grows from here."""

from __future__ import annotations

from PySide6.QtCore import Qt, QThread, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.generate import Finished, PrefillDone, Tokens

from .worker import EngineWorker


class Composer(QPlainTextEdit):
    """Multi-line input: Enter sends, Shift+Enter inserts a new line.

    sig_submitted(str): the user sent the text.
    """

    sig_submitted = Signal(str)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt name)
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not (
            event.modifiers() & Qt.ShiftModifier
        ):
            text = self.toPlainText()
            if text.strip():
                self.sig_submitted.emit(text)
            return
        super().keyPressEvent(event)


class MainWindow(QMainWindow):
    """sig_model_ready(): the engine finished loading (or failed to)."""

    sig_model_ready = Signal()
    _sig_load = Signal(str)
    _sig_generate = Signal(str)

    def __init__(self, model_folder: str = ""):
        super().__init__()
        self.setWindowTitle("Merlin")
        self.resize(1280, 720)
        self.chat = QTextBrowser()
        self.chat.setOpenExternalLinks(True)
        self.composer = Composer()
        self.composer.setPlaceholderText("Ask something… (Enter sends, Shift+Enter: new line)")
        self.composer.setMaximumHeight(120)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.status = QLabel("Loading model…")
        row = QHBoxLayout()
        row.addWidget(self.composer, 1)
        row.addWidget(self.send_button)
        row.addWidget(self.stop_button)
        layout = QVBoxLayout()
        layout.addWidget(self.chat, 1)
        layout.addLayout(row)
        layout.addWidget(self.status)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)

        self._ready = False
        self._busy = False
        self._queued: str | None = None
        self._pending_text = ""
        self._flush_timer = QTimer(self, interval=33)  # coalesce tokens: ~30 updates/s at most
        self._flush_timer.timeout.connect(self._flush)

        self.thread_ = QThread(self)
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread_)
        self._sig_load.connect(self.worker.load)
        self._sig_generate.connect(self.worker.generate)
        self.worker.sig_loaded.connect(self.on_loaded)
        self.worker.sig_load_failed.connect(self.on_load_failed)
        self.worker.sig_progress.connect(self.on_progress)
        self.worker.sig_event.connect(self.on_event)
        self.worker.sig_failed.connect(self.on_failed)
        self.composer.sig_submitted.connect(self.send)
        self.send_button.clicked.connect(lambda: self.send(self.composer.toPlainText()))
        self.stop_button.clicked.connect(self.worker.cancel.set)
        self.thread_.start()
        self._sig_load.emit(model_folder)

    # -- slots ---------------------------------------------------------------------------
    def on_progress(self, fraction: float, phase: str) -> None:
        self.status.setText(f"Loading model: {phase} ({fraction:.0%})")

    def on_loaded(self, description: str) -> None:
        self._ready = True
        self.status.setText(f"Ready — {description}")
        self.sig_model_ready.emit()
        if self._queued is not None:
            text, self._queued = self._queued, None
            self._start(text)

    def on_load_failed(self, message: str) -> None:
        self.status.setText(f"Could not load the model: {message}")
        self.sig_model_ready.emit()

    def on_event(self, event) -> None:
        if isinstance(event, PrefillDone):
            self.status.setText(f"Prompt: {event.n_tokens} tokens in {event.prefill_ms:.0f} ms")
        elif isinstance(event, Tokens):
            self._pending_text += event.text
        elif isinstance(event, Finished):
            self._flush()
            self._flush_timer.stop()
            t = event.totals
            self.status.setText(
                f"{event.reason}: {t.get('generated_tokens', 0)} tokens, "
                f"{t.get('tokens_per_s', 0):.1f} tokens/s"
            )
            self._set_busy(False)

    def on_failed(self, message: str) -> None:
        self._flush()
        self._flush_timer.stop()
        self._append(f"\n[{message}]")
        self._set_busy(False)

    # -- actions -------------------------------------------------------------------------
    def send(self, text: str) -> None:
        if not text.strip() or self._busy:
            return
        self.composer.clear()
        if not self._ready:
            self._queued = text  # typed while loading: kept, sent when the model is ready
            self._append_message("You", text)
            self.status.setText("Your message is queued until the model has loaded.")
            return
        self._append_message("You", text)
        self._start(text)

    def _start(self, text: str) -> None:
        self._append_message("Merlin", "")
        self._set_busy(True)
        self._flush_timer.start()
        self._sig_generate.emit(text)

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def _append_message(self, who: str, text: str) -> None:
        cursor = self.chat.textCursor()
        cursor.movePosition(QTextCursor.End)
        cursor.insertHtml(f"<p><b>{who}</b></p>")
        cursor.insertBlock()
        cursor.insertText(text)
        self.chat.setTextCursor(cursor)

    def _append(self, text: str) -> None:
        cursor = self.chat.textCursor()
        cursor.movePosition(QTextCursor.End)
        cursor.insertText(text)
        self.chat.setTextCursor(cursor)

    def _flush(self) -> None:
        if self._pending_text:
            self._append(self._pending_text)
            self._pending_text = ""

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt name)
        self.worker.cancel.set()
        self.thread_.quit()
        self.thread_.wait(5000)
        super().closeEvent(event)
