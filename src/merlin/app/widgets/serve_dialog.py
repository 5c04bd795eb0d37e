"""Model > Serve to other apps: where to serve the loaded model on the OpenAI API.

Only this computer (127.0.0.1) by default; other devices on the network (0.0.0.0) always need
an API key: the one typed here, or one generated when the server starts and shown with its
address. The key is not saved (a new one each time the app starts serving, unless typed).
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
)

from merlin.app.i18n import tr
from merlin.engine.server.embedded import ServeOptions

DEFAULT_PORT = 8080


class ServeDialog(QDialog):
    def __init__(self, port: int = DEFAULT_PORT, context: int = 8192, parent=None):
        super().__init__(parent)
        self.setWindowTitle(tr("Serve to other apps"))
        self._context = context
        self.local = QRadioButton(tr("Only this computer (127.0.0.1)"))
        self.network = QRadioButton(tr("Other devices on the network (needs an API key)"))
        self.local.setChecked(True)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(port if 1 <= port <= 65535 else DEFAULT_PORT)
        self.key = QLineEdit()
        self.key.setPlaceholderText(tr("(generated when needed)"))
        note = QLabel(
            tr(
                "Other programs (Open WebUI, editors, scripts) can then use the loaded model "
                "through the OpenAI API at the address shown. Their requests take turns with "
                "your own questions."
            )
        )
        note.setWordWrap(True)
        form = QFormLayout()
        form.addRow(self.local)
        form.addRow(self.network)
        form.addRow(tr("Port"), self.port)
        form.addRow(tr("API key"), self.key)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.button(QDialogButtonBox.Ok).setText(tr("Serve"))
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addLayout(form)
        layout.addWidget(buttons)

    def options(self) -> ServeOptions:
        return ServeOptions(
            host="0.0.0.0" if self.network.isChecked() else "127.0.0.1",
            port=self.port.value(),
            api_key=self.key.text().strip() or None,
            context=self._context,
        )


def toggle_serving(window, on: bool) -> None:
    """The window's Model > Serve action: ask where, then start; or stop."""
    c = window.controller
    if not on:
        c.stop_serving()
        return
    window.act_serve.setChecked(False)  # checked once the server says it runs
    if c.model is None:
        window.on_notice("warning", tr("Load a model first; then it can be served."))
        return
    dialog = ServeDialog(
        window.settings.serve_port, window.settings.generation_options().context_budget, window
    )
    if dialog.exec() != QDialog.Accepted:
        return
    options = dialog.options()
    window.settings.serve_port = options.port
    c.start_serving(options)


def show_serving(window, status) -> None:
    """A ServeStatus from the engine thread: the action's state and a line for the user."""
    window.serving_status = status
    window.act_serve.setChecked(bool(status.url))
    if status.url:
        key = tr(" Clients send the API key {key}.").format(key=status.api_key)
        text = tr("Serving the model to other apps at {url}.").format(url=status.url)
        window.on_notice("info", text + (key if status.api_key else ""))
    elif status.message:
        window.on_notice("warning", tr("Not serving: {why}").format(why=status.message))
    elif window.notice_banner.kind == "info":
        window.notice_banner.hide()
