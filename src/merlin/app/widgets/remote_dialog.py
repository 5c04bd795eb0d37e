"""The "OpenAI-compatible server" part of the model dialog: address, API key, model.

"Fetch models" asks the server (GET /v1/models) on a worker thread, the window answering
meanwhile (a server that accepts and stays silent is given up after model.remote's listing
timeout), and fills the model list; the model can also be typed. Used by app/model_dialog.py.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from merlin.app.i18n import tr
from merlin.app.model.remote import (
    RemoteConfig,
    RemoteError,
    check_api_key,
    list_models,
    normalize_url,
)
from merlin.app.widgets.background import BackgroundJob


class RemoteBox(QGroupBox):
    def __init__(self, current: RemoteConfig | None = None, parent=None):
        super().__init__(tr("OpenAI-compatible server"), parent)
        current = current or RemoteConfig("")
        form = QFormLayout(self)
        self.url = QLineEdit(current.base_url)
        self.url.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.key = QLineEdit(current.api_key)
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText(tr("(none)"))
        # the saved key is the saved server's: another address does not get it unasked
        self._saved = (_origin(current.base_url), current.api_key)
        self.url.textChanged.connect(self._key_follows_server)
        self.model = QComboBox()
        self.model.setEditable(True)
        if current.model:
            self.model.addItem(current.model)
        self.fetch_button = QPushButton(tr("Fetch models"))
        self.fetch_button.clicked.connect(self.fetch)
        row = QWidget()
        h = QHBoxLayout(row)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(self.model, 1)
        h.addWidget(self.fetch_button)
        self.status = QLabel()
        self.status.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.status.setWordWrap(True)
        form.addRow(tr("Address"), self.url)
        form.addRow(tr("API key"), self.key)
        form.addRow(tr("Model"), row)
        form.addRow(self.status)
        note = QLabel(
            tr(
                "Answers come from that server: the panel shows time to first token, tokens/s "
                "and tokens in/out; the GEMM/attention split and speculative statistics are not "
                "available remotely. The key is kept in a file of its own, not with the chats."
            )
        )
        note.setWordWrap(True)
        form.addRow(note)

    def _key_follows_server(self, url: str) -> None:
        origin, key = self._saved
        if not key:
            return
        if _origin(url) != origin and self.key.text() == key:
            self.key.clear()
        elif _origin(url) == origin and not self.key.text():
            self.key.setText(key)

    def config(self) -> RemoteConfig:
        return RemoteConfig(
            self.url.text().strip(), self.key.text().strip(), self.model.currentText().strip()
        )

    def problem(self) -> str:
        """Why the address cannot be used ('' when it may be)."""
        try:
            normalize_url(self.url.text())
            check_api_key(self.key.text().strip())
        except RemoteError as e:
            return str(e)
        return ""

    def fetch(self) -> BackgroundJob:
        """Ask the server for its models on a worker; then fill the list, and the status line
        says what happened (the job's result: whether the list was filled)."""
        self.fetch_button.setEnabled(False)
        self.status.setText(tr("Asking the server…"))
        config = self.config()
        return BackgroundJob(
            self, lambda: list_models(config), self._fetched, self._fetch_failed, "merlin-models"
        )

    def _fetch_failed(self, e: BaseException):
        self.fetch_button.setEnabled(True)
        if not isinstance(e, Exception):
            return NotImplemented
        # RemoteError says what to do; anything else (an address httpx refuses) is named
        self.status.setText(str(e) if isinstance(e, RemoteError) else f"{type(e).__name__}: {e}")
        return False

    def _fetched(self, models: list[str]) -> bool:
        self.fetch_button.setEnabled(True)
        keep = self.model.currentText()
        self.model.clear()
        self.model.addItems(models)
        if keep in models:
            self.model.setCurrentText(keep)
        self.status.setText(tr("{n} model(s) on the server.").format(n=len(models)))
        return True


def _origin(url: str) -> str:
    """scheme://host:port of an address as typed ("" if it has none)."""
    try:
        parts = urlsplit(url.strip() if "://" in url else "http://" + url.strip())
        return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{parts.port or ''}"
    except ValueError:
        return ""
