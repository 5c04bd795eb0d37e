"""The conversation flow: the store, the engine worker and the views, kept consistent.

Everything here runs on the GUI thread. Order of a turn: the user message (and its images) is
committed to the store, then shown, then the answer row is committed as `streaming`, then the
worker is asked to generate. Tokens are buffered and shown by a ~30 Hz flush timer; the answer
text is committed at most every half second while it streams and once more when it ends.

The worker keeps the engine session of the conversation shown (see app/worker.py): opening a
conversation asks it to switch (restoring the saved session), deleting one deletes its saved
session. Notices from the engine (older turns left out of the context, speculative decoding
turned off) are shown on the answer they concern and stored with it.
"""

from __future__ import annotations

import gc
import itertools
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QThread, QTimer, Signal

from merlin.app.image_encoding import ImageEncoding
from merlin.app.model.paths import sessions_dir
from merlin.app.model.perf_stats import PerfStats
from merlin.app.model.prompting import Turn
from merlin.app.model.store import MessageRow, Store, StoreError
from merlin.app.settings import AppSettings
from merlin.app.widgets.attachments import Attachment, AttachmentError, load_attachment
from merlin.app.widgets.chat_view import ChatView, MessageWidget
from merlin.app.widgets.composer import Composer
from merlin.app.worker import (
    EngineWorker,
    GenerationJob,
    LoadRequest,
    ModelInfo,
    SessionJob,
    SessionReport,
)
from merlin.engine.errors import InputError
from merlin.engine.generate import Finished, PrefillDone, Tokens
from merlin.engine.prompt import check_user_text
from merlin.engine.session import ContextTrimmed

from .i18n import tr

log = logging.getLogger(__name__)

FLUSH_MS = 33  # at most ~30 view updates per second while streaming
COMMIT_S = 0.5  # the streaming answer reaches the disk at least this often
MB = 1024 * 1024
STATE_OF_REASON = {
    "stop_token": "done",
    "max_tokens": "done",
    "context_full": "done",
    "cancelled": "stopped",
    "error": "error",
}


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach.

    A full (generation 2) collection walks every tracked object: with Qt, NumPy and Numba
    loaded that is 130k+ objects and took 57-78 ms, holding the GIL, which froze the window
    during model loading. Objects that live as long as the app (modules, the model, compiled
    kernels) are frozen after start and after each load, so later collections stay short.
    """
    gc.freeze()


@dataclass
class Answer:
    """The answer being generated."""

    job: GenerationJob
    conversation_id: int
    message_id: int
    widget: MessageWidget | None
    text: str = ""
    dirty: bool = False
    committed_at: float = field(default_factory=time.monotonic)
    committed_text: str = ""
    notices: list[str] = field(default_factory=list)  # shown on the answer, stored with it
    trim_notice: str = ""  # the engine's own words for a ContextTrimmed (not shown twice)
    drafted: list[tuple[int, int]] = field(default_factory=list)  # text spans of verify steps
    # that accepted speculative drafts (tinted in the chat when the answer ends)


class ChatController(QObject):
    """sig_model_ready(): a load ended (loaded, failed or cancelled).
    sig_model_changed(object): the ModelInfo now in use.
    sig_load_progress(float, str): fraction, phase of the load in progress.
    sig_load_failed(str): the message for the user.
    sig_busy_changed(bool): an answer started (True) or ended (False).
    sig_answer_finished(str): the answer's final state (done, stopped, error).
    sig_conversations_changed(): titles, order or membership of the conversation list changed.
    sig_notice(str, str): kind (info, warning, error) and a message for the banner.
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
    _sig_load = Signal(object)
    _sig_generate = Signal(object)
    _sig_prepare = Signal(object)
    _sig_forget = Signal(object)
    _sig_session_cap = Signal(object)  # bytes (object: may not fit a C int)

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
        self.model: ModelInfo | None = None
        self.loading: LoadRequest | None = None
        self.current_id: int | None = None
        self.answer: Answer | None = None
        self.editing_id: int | None = None
        self.waiting_for_model = False
        self.ask: Callable[[str, str], bool] = lambda title, text: True  # the window sets it
        self._after_answer: list[Callable[[], None]] = []
        self._job_ids = itertools.count(1)
        self.last_restore: SessionReport | None = None  # for the status and tests
        self.last_save: SessionReport | None = None

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
        self.worker.sig_session.connect(self.on_session_report)
        self.worker.sig_load_progress.connect(self.on_load_progress)
        self.worker.sig_loaded.connect(self.on_loaded)
        self.worker.sig_load_failed.connect(self.on_load_failed)
        self.worker.sig_load_cancelled.connect(self.on_load_cancelled)
        self.worker.sig_event.connect(self.on_event)
        self.worker.sig_failed.connect(self.on_failed)
        self.worker.sig_job_done.connect(self.on_job_done)
        # images encoded on attach, while the user types (app/image_encoding.py)
        self.images = ImageEncoding(composer, self.settings.generation_options, self)
        self.images.sig_job.connect(self.worker.encode_image)
        self.worker.sig_image.connect(self.images.on_status)
        self.thread.start()

        self.flush_timer = QTimer(self, interval=FLUSH_MS)
        self.flush_timer.timeout.connect(self.flush)

        composer.sig_send.connect(self.on_send)
        composer.sig_stop.connect(self.stop)
        composer.sig_edit_cancelled.connect(self._on_edit_cancelled)
        chat.sig_edit_requested.connect(self.begin_edit)
        chat.sig_regenerate_requested.connect(self.regenerate)

    # ---- state ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.answer is not None

    @property
    def ready(self) -> bool:
        return self.model is not None and self.loading is None

    # ---- model ---------------------------------------------------------------------------

    def load_model(self, source: str, weights: str = "f32", kv: str = "f32") -> None:
        """Load (in the worker); the current model stays in use until the new one is ready."""
        if self.loading is not None:
            self.loading.cancel.set()
        if self.answer is not None:
            self.answer.job.cancel.set()  # the worker finishes the answer, then loads
        self.loading = LoadRequest(source, weights, kv)
        self.sig_load_progress.emit(0.0, "waiting for the engine")
        self._sig_load.emit(self.loading)

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.loading.cancel.set()

    def on_load_progress(self, fraction: float, phase: str) -> None:
        if self.loading is not None:
            self.sig_load_progress.emit(fraction, phase)

    def on_loaded(self, info: ModelInfo) -> None:
        self.loading = None
        freeze_heap()  # the model and its kernels live until the next load
        self.model = info
        self.images.model_ready(info.vision)
        self.stats.model_name = info.name
        self.stats.weights_fmt, self.stats.kv_fmt = info.weights, info.kv
        self.stats.spec_mode, self.stats.spec_k = self.settings.spec_mode, self.settings.spec_k
        self.stats.clear_history()
        self.sig_model_changed.emit(info)
        self.sig_model_ready.emit()
        self._prepare_session()
        self._answer_waiting()

    def on_load_failed(self, message: str) -> None:
        self.loading = None
        self.sig_load_failed.emit(message)
        self.sig_model_ready.emit()

    def on_load_cancelled(self) -> None:
        self.loading = None
        self.sig_notice.emit("info", tr("Loading was cancelled; the previous model stays."))
        self.sig_model_ready.emit()
        self._answer_waiting()

    def _answer_waiting(self) -> None:
        if not self.ready or self.answer is not None or self.current_id is None:
            return
        rows = self.store.messages(self.current_id)
        if rows and rows[-1].role == "user":
            self.waiting_for_model = False
            widget = self.chat.message(rows[-1].id)
            if widget is not None:
                widget.set_state("done")
            if rows[-1].state == "queued":
                self.store.update_message(rows[-1].id, state="done")
            self._start_answer()

    # ---- sending -------------------------------------------------------------------------

    def on_send(self, text: str, attachments: list) -> None:
        if self.send(text, attachments):
            self.composer.end_edit(restore_draft=False)
            self.composer.clear()

    def send(self, text: str, attachments: list[Attachment] = ()) -> bool:
        """Commit the user's message and start (or queue) the answer. False: nothing was
        taken from the composer (busy, empty, refused edit, or the store failed)."""
        if self.answer is not None or (not text.strip() and not attachments):
            return False
        try:
            text = check_user_text(text)
        except InputError as e:  # too long: say so under the box, keep the text in it
            self.composer.show_notice(tr("This message cannot be sent: {why}").format(why=e))
            return False
        if self.editing_id is not None:
            rows = self.store.messages(self.current_id) if self.current_id else []
            later = [r for r in rows if r.id >= self.editing_id]
            if later and not self.ask(
                tr("Replace messages?"),
                tr(
                    "Sending the edited message replaces it and the {n} message(s) after it. "
                    "Continue?"
                ).format(n=len(later) - 1),
            ):
                return False
        try:
            refs = [self.store.import_image(a.path, a.name) for a in attachments]
            for a, r in zip(attachments, refs):  # each image's budget goes with it
                self.images.remember(str(self.store.image_path(r)), a)
            if self.editing_id is not None and self.current_id is not None:
                self.store.delete_messages_from(self.current_id, self.editing_id)
                self.chat.remove_from(self.editing_id)
                self.editing_id = None
            if self.current_id is None:
                self.current_id = self.store.create_conversation(_title(text, bool(refs)))
                self.settings.last_conversation = self.current_id
                self.sig_conversations_changed.emit()
            state = "done" if self.ready else "queued"
            mid = self.store.add_message(self.current_id, "user", text, refs, state=state)
        except (OSError, sqlite3.Error, StoreError) as e:
            self.sig_notice.emit(
                "error",
                tr("Your message could not be saved ({why}); it is still in the box below.").format(
                    why=e
                ),
            )
            return False
        self.chat.add_message(
            mid,
            "user",
            text,
            [str(self.store.image_path(r)) for r in refs],
            [r.name for r in refs],
            state=state,
        )
        self.chat.scroll_to_bottom()
        self.sig_conversations_changed.emit()
        if self.ready:
            self._start_answer()
        else:
            self.waiting_for_model = True
            self.sig_notice.emit(
                "info", tr("Your message is saved and will be answered when the model is ready.")
            )
        self._update_actions()
        return True

    def _turns(self, rows: list[MessageRow]) -> list[Turn]:
        turns = []
        for r in rows:
            if r.role == "assistant" and (r.state == "error" or not r.text.strip()):
                continue  # a failed answer is shown, never sent back to the model
            paths = [self.images.image(str(self.store.image_path(ref))) for ref in r.images]
            turns.append(Turn(r.role, r.text, paths))
        return turns

    def _start_answer(self) -> None:
        cid = self.current_id
        rows = self.store.messages(cid)
        job = GenerationJob(
            next(self._job_ids),
            self._turns(rows),
            self.settings.generation_options(),
            conversation_id=cid,
        )
        try:
            mid = self.store.add_message(cid, "assistant", "", state="streaming")
        except (sqlite3.Error, StoreError) as e:
            self.sig_notice.emit("error", tr("The chat store failed: {why}").format(why=e))
            return
        widget = self.chat.add_message(mid, "assistant", "", state="streaming")
        self.answer = Answer(job, cid, mid, widget)
        self.stats.spec_mode, self.stats.spec_k = self.settings.spec_mode, self.settings.spec_k
        self.stats.start(time.perf_counter())
        self.composer.set_busy(True)
        self.flush_timer.start()
        self._update_actions()
        self.sig_busy_changed.emit(True)
        self._sig_generate.emit(job)

    # ---- streaming -----------------------------------------------------------------------

    def on_event(self, job_id: int, event) -> None:
        a = self.answer
        if a is None or a.job.job_id != job_id:
            return
        if isinstance(event, Tokens):
            if event.text:
                start = len(a.text)
                a.text += event.text
                a.dirty = True
                if event.profile.spec.get("accepted"):
                    a.drafted.append((start, len(a.text)))
            self.stats.tokens_event(event.ids, event.profile, time.perf_counter())
        elif isinstance(event, PrefillDone):
            self.stats.prefill(event.n_tokens, event.vision_ms, event.prefill_ms, event.reused)
        elif isinstance(event, ContextTrimmed):
            a.trim_notice = event.notice
            self._add_notice(a, trim_notice(len(event.dropped)))
        elif isinstance(event, Finished):
            for text in event.totals.get("notices") or []:
                if text and text != a.trim_notice:
                    self._add_notice(a, text)
            self._finish(event.reason, event.totals)

    def _add_notice(self, a: Answer, text: str) -> None:
        if text not in a.notices:
            a.notices.append(text)
            if a.widget is not None:
                a.widget.set_notices(a.notices)

    def on_failed(self, job_id: int, message: str) -> None:
        a = self.answer
        if a is None or a.job.job_id != job_id:
            return
        self._finish("error", {}, tr("The answer failed: {why}").format(why=message))

    def on_job_done(self, job_id: int) -> None:
        a = self.answer
        if a is not None and a.job.job_id == job_id:  # ended without Finished: keep the text
            self._finish("error", {}, tr("The engine stopped without finishing the answer."))

    def flush(self) -> None:
        a = self.answer
        if a is None:
            return
        if a.dirty and a.widget is not None:
            a.widget.stream(a.text)
            a.dirty = False
        if a.text != a.committed_text and time.monotonic() - a.committed_at >= COMMIT_S:
            self._commit(a)

    def _commit(self, a: Answer, state: str | None = None, stats: dict | None = None) -> None:
        try:
            self.store.update_message(a.message_id, a.text, state, stats)
            a.committed_text = a.text
        except (sqlite3.Error, StoreError) as e:
            self.sig_notice.emit("error", tr("The answer could not be saved: {why}").format(why=e))
        a.committed_at = time.monotonic()

    def _finish(self, reason: str, totals: dict, error: str = "") -> None:
        a = self.answer
        if a is None:
            return
        self.flush_timer.stop()
        state = STATE_OF_REASON.get(reason, "done")
        stats = {
            "reason": reason,
            "tokens": totals.get("generated_tokens", self.stats.tokens),
            "tokens_per_s": totals.get("tokens_per_s"),
            "prompt_tokens": totals.get("prompt_tokens"),
            "prefill_ms": totals.get("prefill_ms"),
            "vision_ms": totals.get("vision_ms"),
            "ttft_ms": round(self.stats.ttft_ms, 1) if self.stats.ttft_ms else None,
            "reused_tokens": totals.get("reused_tokens"),
            "notices": list(a.notices) or None,
            "drafted": [list(span) for span in a.drafted] or None,
        }
        if error:
            stats["error"] = error
        stats = {k: v for k, v in stats.items() if v is not None}
        self._commit(a, state, stats)
        if a.widget is not None:
            a.widget.finish(a.text, state, stats, error)
        self.answer = None
        self.stats.finished(reason, totals)
        self.composer.set_busy(False)
        self._update_actions()
        if error:
            self.sig_notice.emit("error", error)
        self.sig_busy_changed.emit(False)
        self.sig_answer_finished.emit(state)
        pending, self._after_answer = self._after_answer, []
        for action in pending:
            action()

    def stop(self) -> None:
        if self.answer is not None:
            self.answer.job.cancel.set()
            self.images.stop_sent()  # the sent images' encodes too, if still running

    def _when_idle(self, action: Callable[[], None]) -> None:
        """Run now, or after the current answer ends (stopping it)."""
        if self.answer is None:
            action()
        else:
            self._after_answer.append(action)
            self.stop()

    # ---- regenerate and edit -------------------------------------------------------------

    def regenerate(self, message_id: int) -> None:
        if self.answer is not None or self.current_id is None or not self.ready:
            return
        rows = self.store.messages(self.current_id)
        if not rows or rows[-1].id != message_id or rows[-1].role != "assistant":
            return
        self.store.delete_messages_from(self.current_id, message_id)
        self.chat.remove_from(message_id)
        self._start_answer()

    def begin_edit(self, message_id: int) -> None:
        if self.answer is not None or self.current_id is None:
            return
        row = next((r for r in self.store.messages(self.current_id) if r.id == message_id), None)
        if row is None or row.role != "user":
            return
        attachments, missing = [], []
        for ref in row.images:
            try:
                attachments.append(load_attachment(self.store.image_path(ref), ref.name))
            except AttachmentError as e:
                missing.append(str(e))
        self.editing_id = message_id
        self.composer.begin_edit(row.text, attachments)
        if missing:
            self.composer.show_notice("\n".join(missing))

    def _on_edit_cancelled(self) -> None:
        self.editing_id = None

    # ---- saved sessions ------------------------------------------------------------------

    def _prepare_session(self) -> None:
        """Let the worker switch to the session of the conversation shown (restoring it from
        disk now, not when the next question arrives); None releases the previous one."""
        if not self.ready:
            return
        cid = self.current_id
        rows = self.store.messages(cid) if cid is not None else []
        self._sig_prepare.emit(
            SessionJob(cid, self._turns(rows), self.settings.generation_options())
        )

    def set_session_cap(self, cap_mb: int) -> None:
        self._sig_session_cap.emit(max(0, int(cap_mb)) * MB)

    def on_session_report(self, report: SessionReport) -> None:
        if report.action in ("restored", "not_restored"):
            self.last_restore = report
            if report.reason and report.action == "not_restored":
                log.info("chat %s is recomputed: %s", report.conversation_id, report.reason)
        else:
            self.last_save = report
            if report.action == "not_saved" and report.reason:
                self.sig_notice.emit(
                    "info",
                    tr("This chat's session was not saved for quick continuation: {why}").format(
                        why=report.reason
                    ),
                )
        self.sig_session.emit(report)

    # ---- conversations -------------------------------------------------------------------

    def open_conversation(self, conversation_id: int | None) -> None:
        def do():
            if self.editing_id is not None:
                self.composer.end_edit(restore_draft=True)
                self.editing_id = None
            self.current_id = conversation_id
            self.settings.last_conversation = conversation_id or 0
            self.chat.clear()
            if conversation_id is not None:
                for r in self.store.messages(conversation_id):
                    self._show_row(r)
                self.chat.scroll_to_bottom()
            self._update_actions()
            self._prepare_session()
            self._answer_waiting()

        self._when_idle(do)

    def new_conversation(self) -> None:
        self.open_conversation(None)
        self.sig_conversations_changed.emit()

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title.strip()[:200])
        self.sig_conversations_changed.emit()

    def delete_conversation(self, conversation_id: int) -> None:
        def do():
            self.store.delete_conversation(conversation_id)
            self._sig_forget.emit(conversation_id)
            if conversation_id == self.current_id:
                self.open_conversation(None)
            self.sig_conversations_changed.emit()

        self._when_idle(do)

    def _show_row(self, r: MessageRow) -> MessageWidget:
        return self.chat.add_message(
            r.id,
            r.role,
            r.text,
            [str(self.store.image_path(ref)) for ref in r.images],
            [ref.name for ref in r.images],
            state=r.state,
            stats=r.stats,
            error=r.stats.get("error", "") if r.state == "error" else "",
        )

    def _update_actions(self) -> None:
        self.chat.update_actions(busy=self.answer is not None)

    # ---- shutdown ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the engine thread; a streaming answer is saved as stopped."""
        a = self.answer
        if a is not None:
            a.job.cancel.set()
            self._commit(a, "stopped", {"reason": "cancelled", "tokens": self.stats.tokens})
            self.answer = None
        if self.loading is not None:
            self.loading.cancel.set()
        self.flush_timer.stop()
        self.thread.quit()
        self.thread.wait(30_000)


def trim_notice(n_dropped: int) -> str:
    return tr(
        "The conversation no longer fits in the context budget: the {n} oldest message(s) are "
        "left out of what the model sees (they stay in the chat)."
    ).format(n=n_dropped)


def _title(text: str, has_images: bool) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        return tr("Image chat") if has_images else tr("New chat")
    return first if len(first) <= 48 else first[:47].rstrip() + "…"
