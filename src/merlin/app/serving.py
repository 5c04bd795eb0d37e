"""The app's "serve to other apps" switch: the loaded model on the OpenAI API while the app is
open (engine.server.embedded), for Open WebUI, editors or scripts on this computer or the
local network.

`ServeWorker` lives in the engine thread beside the EngineWorker, so it reads the model the
worker has loaded there. The server runs on threads of its own and takes the worker's
`engine_lock` for each request, the lock the worker holds while it answers or encodes: a
served request waits while the app computes and the app's next answer waits for a served
request to end (the composer's Stop still works meanwhile). When another model is loaded
the server starts again on it at the same address; with a remote server in use (nothing to
serve locally) it stops and says why. Results come back as a ServeStatus.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, Signal, Slot

from merlin.engine.errors import MerlinError


@dataclass(frozen=True)
class ServeStatus:
    """url: where the API is served ("" when it is not); api_key: what clients must send
    (None: no key needed); message: why it stopped or could not start ("" otherwise)."""

    url: str = ""
    api_key: str | None = None
    message: str = ""


class ServeWorker(QObject):
    """sig_status(ServeStatus): serving started, stopped or failed."""

    sig_status = Signal(object)

    def __init__(self, worker):
        super().__init__()
        self._worker = worker
        self._server = None
        self._options = None  # engine.server.embedded.ServeOptions while switched on
        worker.sig_loaded.connect(self._on_model_changed)

    @property
    def engine_lock(self) -> threading.Lock:
        return self._worker.engine_lock

    @Slot(object)
    def start(self, options) -> None:
        """Serve the loaded model with these ServeOptions (restarts if already serving)."""
        self._options = options
        self._restart()

    @Slot()
    def stop(self) -> None:
        self._options = None
        self._stop_server()
        self.sig_status.emit(ServeStatus())

    def _on_model_changed(self, _info=None) -> None:
        if self._options is not None:
            self._restart()

    def _restart(self) -> None:
        from merlin.engine.server.embedded import EmbeddedServer

        self._stop_server()
        model = self._worker.model
        if model is None:
            self._options = None
            self.sig_status.emit(
                ServeStatus(
                    message="nothing to serve: load a local model first (a remote server "
                    "cannot be served again from here)."
                )
            )
            return
        try:
            self._server = EmbeddedServer.start(model, self._options, self.engine_lock)
        except MerlinError as e:
            self._options = None
            self.sig_status.emit(ServeStatus(message=str(e)))
            return
        # a generated key stays the same when the server starts again on another model
        self._options = replace(self._options, api_key=self._server.api_key)
        self.sig_status.emit(ServeStatus(self._server.url, self._server.api_key))

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @Slot()
    def shutdown(self) -> None:
        self._options = None
        self._stop_server()
