"""The Qt binding of the conversation flow: app/model/conversation.py (Qt-free) wired to the
widgets, the engine thread and Qt signals.

This file owns what needs Qt: the engine's QThread and the queued signals to its worker, the
~30 Hz flush timer while an answer streams, the composer's and chat view's signals, loading an
edited message's images into the composer. The turn flow itself (store commits, what is shown
when, notices, saved sessions) is ConversationModel's; ChatController exposes its state and
methods under the names the window and the tests use.
"""

from __future__ import annotations

import gc
import logging

from PySide6.QtCore import QObject, QThread, QTimer, Signal

from merlin.app.context_meter import ContextMeter
from merlin.app.image_encoding import ImageEncoding
from merlin.app.model.conversation import ConversationModel
from merlin.app.model.conversation import title as _conversation_title
from merlin.app.model.conversation import trim_notice as _trim_notice
from merlin.app.model.jobs import LoadRequest, ModelInfo, SessionReport  # noqa: F401
from merlin.app.model.paths import sessions_dir
from merlin.app.model.perf_stats import PerfStats
from merlin.app.model.store import Store
from merlin.app.serving import ServeWorker
from merlin.app.settings import AppSettings
from merlin.app.widgets.chat_view import ChatView
from merlin.app.widgets.composer import Composer
from merlin.app.worker import EngineWorker

from .i18n import tr

log = logging.getLogger(__name__)

FLUSH_MS = 33  # at most ~30 view updates per second while streaming
MB = 1024 * 1024


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach.

    A full (generation 2) collection walks every tracked object: with Qt, NumPy and Numba
    loaded that is 130k+ objects and took 57-78 ms, holding the GIL, which froze the window
    during model loading. Objects that live as long as the app (modules, the model, compiled
    kernels) are frozen after start and after each load, so later collections stay short.
    """
    gc.freeze()


def _delegate(name: str, writable: bool = False) -> property:
    """A property reading (and writing) the conversation model's attribute `name`."""

    def get(self):
        return getattr(self.conversation, name)

    def put(self, value) -> None:
        setattr(self.conversation, name, value)

    return property(get, put if writable else None)


class _EngineSignals:
    """The conversation model's engine port: each request is a queued signal to the worker."""

    def __init__(self, controller: ChatController):
        self.c = controller

    def load(self, request) -> None:
        self.c._sig_load.emit(request)

    def generate(self, job) -> None:
        self.c._sig_generate.emit(job)

    def prepare(self, job) -> None:
        self.c._sig_prepare.emit(job)
        self.c.meter.schedule()  # another chat shown: count its context

    def forget(self, conversation_id) -> None:
        self.c._sig_forget.emit(conversation_id)

    def set_session_cap(self, cap_bytes: int) -> None:
        self.c._sig_session_cap.emit(cap_bytes)


class ChatController(QObject):
    """sig_model_ready(): a load ended (loaded, failed or cancelled).
    sig_model_changed(object): the ModelInfo now in use.
    sig_load_progress(float, str): fraction, phase of the load in progress.
    sig_load_failed(str): the message for the user.
    sig_busy_changed(bool): an answer started (True) or ended (False).
    sig_answer_finished(str): the answer's final state (done, stopped, error).
    sig_conversations_changed(): titles, order or membership of the conversation list changed.
    sig_notice(str, str): kind (info, warning, error) and a message for the banner; kind
        "done": that message no longer applies (it goes if it is still shown).
    sig_session(object): a SessionReport from the worker (saved session restored or saved).
    """

    sig_model_ready = Signal()
    sig_model_changed = Signal(object)
    sig_load_progress = Signal(float, str)
    sig_load_failed = Signal(str)
    sig_busy_changed = Signal(bool)
    sig_answer_finished = Signal(str)
    sig_conversations_changed = Signal()
    sig_notice = Signal(str, str)
    sig_session = Signal(object)
    sig_serving = Signal(object)  # a ServeStatus (app/serving.py)
    _sig_load = Signal(object)
    _sig_generate = Signal(object)
    _sig_prepare = Signal(object)
    _sig_forget = Signal(object)
    _sig_session_cap = Signal(object)  # bytes (object: may not fit a C int)
    _sig_serve = Signal(object)
    _sig_serve_stop = Signal()

    def __init__(
        self,
        store: Store,
        settings: AppSettings,
        chat: ChatView,
        composer: Composer,
        stats: PerfStats,
        parent=None,
    ):
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.chat = chat
        self.composer = composer
        self.stats = stats
        m = self.conversation = ConversationModel(
            store, settings, _EngineSignals(self), chat, composer, stats, tr
        )
        m.model_ready = self.sig_model_ready.emit
        m.model_changed = self.sig_model_changed.emit
        m.load_progress = self.sig_load_progress.emit
        m.load_failed = self.sig_load_failed.emit
        m.busy_changed = self._on_busy_changed
        m.answer_finished = self.sig_answer_finished.emit
        m.conversations_changed = self.sig_conversations_changed.emit
        m.notice = self.sig_notice.emit
        m.session = self.sig_session.emit
        m.loaded_hook = freeze_heap  # the model and its kernels live until the next load
        m.later = lambda action: QTimer.singleShot(0, self, action)  # after waiting events

        freeze_heap()  # the modules are imported: keep them out of full collections
        self.thread = QThread()
        self.thread.setObjectName("merlin-engine")
        self.worker = EngineWorker(sessions_dir(), max(0, settings.session_cap_mb) * MB)
        self.worker.moveToThread(self.thread)
        self._sig_load.connect(self.worker.load)
        self._sig_generate.connect(self.worker.generate)
        self._sig_prepare.connect(self.worker.prepare)
        self._sig_forget.connect(self.worker.forget)
        self._sig_session_cap.connect(self.worker.set_session_cap)
        # the worker's results reach the model through this QObject's methods, so Qt queues
        # them to the GUI thread (a plain callable would run in the engine thread)
        self.worker.sig_session.connect(self.on_session_report)
        self.worker.sig_load_progress.connect(self.on_load_progress)
        self.worker.sig_loaded.connect(self.on_loaded)
        self.worker.sig_load_failed.connect(self.on_load_failed)
        self.worker.sig_load_cancelled.connect(self.on_load_cancelled)
        self.worker.sig_event.connect(self.on_event)
        self.worker.sig_failed.connect(self.on_failed)
        self.worker.sig_job_done.connect(self.on_job_done)
        # images encoded on attach, while the user types (app/image_encoding.py)
        self.images = ImageEncoding(composer, settings.generation_options, self)
        self.images.sig_job.connect(self.worker.encode_image)
        self.worker.sig_image.connect(self.images.on_status)
        m.image_tokens = composer.image_tokens
        m.stopped = self.images.stop_sent
        composer.store_file = lambda path, name: self.store.import_image(path, name)
        # the loaded model on the OpenAI API while the app is open (Model > Serve)
        self.serving = ServeWorker(self.worker)
        self.serving.moveToThread(self.thread)
        self._sig_serve.connect(self.serving.start)
        self._sig_serve_stop.connect(self.serving.stop)
        self.serving.sig_status.connect(self.sig_serving)
        # the composer's context meter, counted on the engine thread (app/context_meter.py)
        self.meter = ContextMeter(composer, m, self)
        self.meter.kv_bytes = stats.session_kv
        self.meter.sig_count.connect(self.worker.count)
        self.worker.sig_count.connect(self.meter.on_report)
        self.sig_busy_changed.connect(self.meter.schedule)
        self.sig_model_ready.connect(self.meter.schedule)
        self.thread.start()

        self.flush_timer = QTimer(self, interval=FLUSH_MS)
        self.flush_timer.timeout.connect(m.flush)

        composer.sig_send.connect(m.submit)
        composer.sig_stop.connect(m.stop)
        composer.sig_edit_cancelled.connect(m.cancel_edit)
        chat.sig_edit_requested.connect(self.begin_edit)
        chat.sig_regenerate_requested.connect(m.regenerate)
        chat.sig_version_requested.connect(m.switch_version)  # model/branching.py
        chat.sig_more_above.connect(m.show_more_above)

    def set_store(self, store: Store) -> None:
        """Use another chat store from now on (a new history started beside a broken one)."""
        self.store = self.conversation.store = store

    def _on_busy_changed(self, busy: bool) -> None:
        if busy:
            self.flush_timer.start()
        else:
            self.flush_timer.stop()
        self.sig_busy_changed.emit(busy)

    # ---- the conversation model's state and actions, by the names the window uses ---------

    current_id = _delegate("current_id", writable=True)
    editing_id = _delegate("editing_id", writable=True)
    last_restore = _delegate("last_restore", writable=True)
    last_save = _delegate("last_save", writable=True)
    ask = _delegate("confirm", writable=True)  # (title, text) -> bool: the window's dialog
    model = _delegate("model")
    loading = _delegate("loading")
    answer = _delegate("answer")
    busy = _delegate("busy")
    ready = _delegate("ready")
    waiting_for_model = _delegate("waiting_for_model")

    def send(self, text: str, attachments=()) -> bool:
        return self.conversation.send(text, attachments)

    def stop(self) -> None:
        self.conversation.stop()

    def load_model(self, source: str, weights: str = "f32", kv: str = "f32", remote=None) -> None:
        self.conversation.load_model(source, weights, kv, remote=remote)

    def cancel_load(self) -> None:
        self.conversation.cancel_load()

    def open_conversation(self, conversation_id: int | None) -> None:
        self.conversation.open_conversation(conversation_id)

    def new_conversation(self) -> None:
        self.conversation.new_conversation()

    def rename_conversation(self, conversation_id: int, name: str) -> None:
        self.conversation.rename_conversation(conversation_id, name)

    def delete_conversation(self, conversation_id: int) -> None:
        self.conversation.delete_conversation(conversation_id)

    def regenerate(self, message_id: int) -> None:
        self.conversation.regenerate(message_id)

    # slots of the worker's signals (GUI thread)

    def on_event(self, job_id: int, event) -> None:
        self.conversation.on_event(job_id, event)

    def on_failed(self, job_id: int, message: str) -> None:
        self.conversation.on_failed(job_id, message)

    def on_job_done(self, job_id: int) -> None:
        self.conversation.on_job_done(job_id)

    def on_session_report(self, report) -> None:
        self.conversation.on_session_report(report)

    def on_load_progress(self, fraction: float, phase: str) -> None:
        self.conversation.on_load_progress(fraction, phase)

    def on_loaded(self, info) -> None:
        self.conversation.on_loaded(info)
        self.images.model_ready(info.vision, info.image_presets)

    def on_load_failed(self, message: str) -> None:
        self.conversation.on_load_failed(message)

    def on_load_cancelled(self) -> None:
        self.conversation.on_load_cancelled()

    def flush(self) -> None:
        self.conversation.flush()

    def on_send(self, text: str, attachments: list) -> None:
        self.conversation.submit(text, attachments)

    def set_session_cap(self, cap_mb: int) -> None:
        self.conversation.set_session_cap(max(0, int(cap_mb)) * MB)

    def begin_edit(self, message_id: int) -> None:
        row = self.conversation.edit_target(message_id)
        if row is None:
            return
        self.composer.begin_edit(row.text, [])
        self.composer.add_paths(  # each at the detail it was sent with
            [str(self.store.image_path(ref)) for ref in row.images],
            [r.name for r in row.images],
            [self.composer.detail_of(r.tokens) for r in row.images],
        )

    def start_serving(self, options) -> None:
        """Serve the loaded model (engine.server.embedded.ServeOptions); sig_serving says how."""
        self._sig_serve.emit(options)

    def stop_serving(self) -> None:
        self._sig_serve_stop.emit()

    def shutdown(self) -> None:
        """Stop the engine thread; a streaming answer is saved as stopped, image encodes and
        loading are cancelled (the engine thread ends at their next check)."""
        self.conversation.shutdown()
        self.images.stop_all()
        self.flush_timer.stop()
        self.thread.quit()
        self.thread.wait(30_000)
        self.serving.shutdown()  # the API server's own threads (the engine thread has ended)


def trim_notice(n_dropped: int) -> str:
    return _trim_notice(n_dropped, tr)


def _title(text: str, has_images: bool) -> str:
    return _conversation_title(text, has_images, tr)
