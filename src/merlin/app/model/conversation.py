"""The conversation flow of the app, without Qt: the chat store, the engine and the views kept
consistent through plain callbacks. app/controller.py binds it to the widgets and the engine
thread; tests drive it with fakes (tests/app/test_conversation_model.py, no QApplication).

Order of a turn: the user message (and its images) is committed to the store, then shown,
then the answer row is committed as `streaming`, then the engine is asked to generate. Tokens
are buffered and shown by flush(), which the binding calls ~30 times a second while an answer
streams; the answer text is committed at most every COMMIT_S seconds while it streams and
once more when it ends.

The engine keeps the session of the conversation shown (see app/worker.py): opening a
conversation asks it to switch (restoring the saved session), deleting one deletes its saved
session. Notices from the engine (older turns left out of the context, speculative decoding
turned off) are shown on the answer they concern and stored with it.

Ports (duck-typed, so fakes are easy):
    engine:   load(LoadRequest), generate(GenerationJob), prepare(SessionJob), forget(id),
              set_session_cap(bytes); its results come back through on_* methods here.
    view:     the chat view: add_message(..., at_top=) -> message handle (stream, finish,
              set_state, set_notices, set_versions) or None, message(id), remove_from(id),
              clear(), scroll_to_bottom(), update_actions(busy=), set_more_above(bool) (older
              messages wait: the view calls show_more_above() when the reader nears them).
    composer: set_busy(bool), show_notice(text), end_edit(restore_draft=), leave_edit(), clear().
    settings: app settings (generation_options(), spec_mode, spec_k, last_conversation,
              map_experts).
Callbacks (attributes, no-ops by default): model_ready(), model_changed(ModelInfo),
load_progress(fraction, phase), load_failed(message), busy_changed(busy), answer_finished(state),
conversations_changed(), notice(kind, text), session(report), confirm(title, text) -> bool,
later(action) (runs action after the waiting events; by default at once).

One class of ~500 lines on purpose: loading, sending, streaming, edits, conversations and
saved sessions all read and change the same few things (the answer in flight, the chat shown,
the model state); split, each part would need all of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from merlin.app.model.branching import Branching
from merlin.app.model.history import missing_images_notice, prompt_turns
from merlin.app.model.jobs import (
    MAP_EXPERTS,
    GenerationJob,
    LoadRequest,
    ModelInfo,
    SessionJob,
    SessionReport,
)
from merlin.app.model.perf_stats import PerfStats
from merlin.app.model.prompting import Turn
from merlin.app.model.store import AT_END, ImageRef, MessageRow, Store, StoreError
from merlin.app.model.thought import ThinkingProgress, Thought, thinking_mode
from merlin.engine.errors import InputError
from merlin.engine.generate import Finished, PrefillDone, Tokens
from merlin.engine.prompt import check_user_text
from merlin.engine.session import ContextTrimmed

log = logging.getLogger(__name__)

COMMIT_S = 0.5  # the streaming answer reaches the disk at least this often
STATE_OF_REASON = {
    "stop_token": "done",
    "max_tokens": "done",
    "context_full": "done",
    "cancelled": "stopped",
    "error": "error",
}


def _nothing(*args, **kwargs) -> None:
    return None


@dataclass
class Answer:
    """The answer being generated."""

    job: GenerationJob
    conversation_id: int
    message_id: int
    widget: object | None  # the view's handle of the answer's message
    text: str = ""
    dirty: bool = False
    committed_at: float = field(default_factory=time.monotonic)
    committed_text: str = ""
    notices: list[str] = field(default_factory=list)  # shown on the answer, stored with it
    trim_notice: str = ""  # the engine's own words for a ContextTrimmed (not shown twice)
    drafted: list[tuple[int, int]] = field(default_factory=list)  # text spans of verify steps
    # that accepted speculative drafts (tinted in the chat when the answer ends)
    thought: Thought = field(default_factory=Thought)  # a thinking model's reasoning
    shown_thought: ThinkingProgress = field(default_factory=ThinkingProgress)
    committed_reasoning: int = 0  # characters of the reasoning committed


def answer_stats(done: Finished | None, a: Answer, stats: PerfStats, reason: str) -> dict:
    """What is stored with an answer (the message row's stats), from the typed Finished."""
    out = {
        "reason": reason,
        "tokens": done.generated_tokens if done is not None else stats.tokens,
        "tokens_per_s": done.tokens_per_s if done is not None else None,
        "prompt_tokens": done.prompt_tokens if done is not None else None,
        "prefill_ms": done.prefill_ms if done is not None else None,
        "vision_ms": done.vision_ms if done is not None else None,
        "ttft_ms": round(stats.ttft_ms, 1) if stats.ttft_ms else None,
        "reused_tokens": done.reused_tokens if done is not None else None,
        "notices": list(a.notices) or None,
        "drafted": [list(span) for span in a.drafted] or None,
        # the ids the text was generated as: the next prompts use them (engine.prompt)
        "token_ids": _answer_ids(done),
        "thinking_s": round(a.thought.seconds(), 1) if a.thought.active else None,
    }
    return {k: v for k, v in out.items() if v is not None}


def _answer_ids(done: Finished | None) -> list[int] | None:
    """The ids of the answer text (a thinking answer's own, without its reasoning)."""
    if done is None:
        return None
    ids = done.answer_ids if done.reasoning is not None else done.token_ids
    return list(ids) if ids else None


# opening a chat shows its last SHOWN_AT_OPEN messages at once, then the older ones
# OLDER_BATCH an event-loop turn (a message with code blocks renders in ~10 ms here: a
# 600-message chat had held the window 3-4 s) until AUTO_SHOWN are shown; older ones come a
# batch at a time when the reader scrolls near them (view.set_more_above, show_more_above):
# each batch lays out the whole column, 163 ms a turn at 2,000 messages, 13 s of stutter)
SHOWN_AT_OPEN = 24
OLDER_BATCH = 8
AUTO_SHOWN = 240


class ConversationModel(Branching):
    """The turn state machine of the chat window. Everything runs on one thread (the GUI's).
    Regenerate, edit and switching versions: branching.py."""

    def __init__(self, store: Store, settings, engine, view, composer, stats: PerfStats, tr=None):
        self.store = store
        self.settings = settings
        self.engine = engine
        self.view = view
        self.composer = composer
        self.stats = stats
        self.tr: Callable[[str], str] = tr or (lambda text: text)
        self.model: ModelInfo | None = None
        self.loading: LoadRequest | None = None
        self._superseded = 0  # loads replaced by a newer one whose end has not come yet
        self.current_id: int | None = None
        self.answer: Answer | None = None
        self.editing_id: int | None = None
        self.waiting_for_model = False
        self.last_restore: SessionReport | None = None  # for the status and tests
        self.last_save: SessionReport | None = None
        self._after_answer: list[Callable[[], None]] = []
        self._job_ids = itertools.count(1)
        # callbacks (the Qt binding turns them into signals)
        self.model_ready = self.conversations_changed = _nothing
        self.model_changed = self.load_failed = self.busy_changed = _nothing
        self.load_progress = self.answer_finished = self.notice = self.session = _nothing
        self.loaded_hook: Callable[[], None] = _nothing  # after a model is in use
        # images encoded on attach (the Qt binding's app/image_encoding.py): a stored image's
        # path -> what the engine gets (its budget with it); attachments stored; answer stopped
        self.image_tokens: Callable[[object], int | None] = lambda attachment: None
        self.stopped: Callable[[], None] = _nothing
        self.confirm: Callable[[str, str], bool] = lambda title, text: True
        # the thinking switch of the chat shown ("on", "off", None: the template's default)
        self.thinking_switch: str | None = None
        self.thinking_changed: Callable[[str | None], None] = _nothing
        # later(action): run action after the events waiting now (the Qt binding: a 0 ms
        # timer); a chat's older messages are shown in batches through it (open_conversation)
        self.later: Callable[[Callable[[], None]], None] = lambda action: action()
        self._opened = itertools.count(1)  # which opening of a chat a batch belongs to
        self._opening = 0
        self._shown_count = 0  # messages of the chat shown so far
        self._more_above: tuple[int, list[MessageRow]] | None = None  # shown when asked

    # ---- state ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.answer is not None

    @property
    def ready(self) -> bool:
        return self.model is not None and self.loading is None

    # ---- model ---------------------------------------------------------------------------

    def load_model(self, source: str, weights: str = "f32", kv: str = "f32", remote=None) -> None:
        """Load (in the engine); the current model stays in use until the new one is ready.
        remote: a merlin.app.model.remote.RemoteConfig, to answer with that server instead."""
        if self.loading is not None:
            self.loading.cancel.set()
            self._superseded += 1  # its end (cancelled, failed or loaded) comes first
        if self.answer is not None:
            self.answer.job.cancel.set()  # the engine finishes the answer, then loads
        mapped = MAP_EXPERTS.get(self.settings.map_experts)  # read at each load
        # 0 (the model's maximum): the load guard uses its default; the cache is checked when made
        context = self.settings.context_budget or None
        self.loading = LoadRequest(
            source, weights, kv, remote=remote, map_experts=mapped, context=context
        )
        self.load_progress(0.0, "waiting for the engine")
        self.engine.load(self.loading)

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.loading.cancel.set()

    def on_load_progress(self, fraction: float, phase: str) -> None:
        if self.loading is not None:
            self.load_progress(fraction, phase)

    def _superseded_ended(self) -> bool:
        """Whether the load that just ended was one a newer load_model replaced (the engine
        loads one after the other): then the newer one is still loading."""
        if self._superseded:
            self._superseded -= 1
            return True
        return False

    def on_loaded(self, info: ModelInfo) -> None:
        superseded = self._superseded_ended()  # it is the model in use until the newer loads
        if not superseded:
            self.loading = None
        self.loaded_hook()
        self.model = info
        self.stats.model_name = info.name
        self.stats.weights_fmt, self.stats.kv_fmt = info.weights, info.kv
        self.stats.spec_mode, self.stats.spec_k = self.settings.spec_mode, self.settings.spec_k
        self.stats.clear_history()
        self.model_changed(info)
        if superseded:
            return
        self.model_ready()
        self._prepare_session()
        self._answer_waiting()

    def on_load_failed(self, message: str) -> None:
        if self._superseded_ended():
            return
        self.loading = None
        self.load_failed(message)
        self.model_ready()

    def on_load_cancelled(self) -> None:
        if self._superseded_ended():
            return
        tr = self.tr
        self.loading = None
        if self.model is not None:
            self.notice("info", tr("Loading was cancelled; the previous model stays."))
        else:
            self.notice("info", tr("Loading was cancelled; no model is loaded."))
        self.model_ready()
        self._answer_waiting()

    def _waiting_notice(self) -> str:
        return self.tr("Your message is saved and will be answered when the model is ready.")

    def _answer_waiting(self) -> None:
        if not self.ready or self.answer is not None:
            return
        if self.waiting_for_model:  # the model is ready: the notice goes, even when the chat
            self.notice("done", self._waiting_notice())  # that waited is gone or not shown
            self.waiting_for_model = False
        if self.current_id is None:
            return
        rows = self.store.messages(self.current_id)
        if rows and rows[-1].role == "user":
            waiting = []  # the user's messages since the last answer, all answered now
            for r in reversed(rows):
                if r.role != "user":
                    break
                waiting.append(r)
            for r in waiting:
                widget = self.view.message(r.id)
                if widget is not None:
                    widget.set_state("done")
                if r.state == "queued":
                    self.store.update_message(r.id, state="done")
            self._start_answer()

    # ---- sending -------------------------------------------------------------------------

    def submit(self, text: str, attachments: list) -> None:
        """The composer's send: on success the composer is emptied, and after an edit it gets
        back what was put aside for it (the message being written before)."""
        if self.send(text, attachments):
            self.composer.clear()
            self.composer.end_edit(restore_draft=True)

    def send(self, text: str, attachments=()) -> bool:
        """Commit the user's message and start (or queue) the answer. False: nothing was
        taken from the composer (busy, empty, refused edit, or the store failed).
        attachments: objects with a path and a name (app/widgets/attachments.py)."""
        tr = self.tr
        if self.answer is not None or (not text.strip() and not attachments):
            return False
        try:
            text = check_user_text(text)
        except InputError as e:  # too long: say so under the box, keep the text in it
            self.composer.show_notice(tr("This message cannot be sent: {why}").format(why=e))
            return False
        if self.current_id is not None and self.store.conversation(self.current_id) is None:
            # deleted in another Merlin window on the same data folder
            self.notice(
                "info",
                tr("This chat was deleted in another window; your message starts a new one."),
            )
            self.current_id, self.editing_id = None, None
            self.view.clear()
            self.conversations_changed()
        # an edit is a new version of the edited message (branching.py): nothing is replaced
        edited = self.editing_id if self.current_id is not None else None
        # after the last message shown: another window on this chat may have gone on
        last = self.view.last_message_id() if self.current_id is not None else None
        parent = self.edit_parent() if edited is not None else (AT_END if last is None else last)
        try:
            # each picture with the budget it is sent at, kept with the message
            refs = [
                dataclasses.replace(self._stored_image(a), tokens=self.image_tokens(a))
                for a in attachments
            ]
            if self.current_id is None:
                self.current_id = self.store.create_conversation(title(text, bool(refs), tr))
                if self.thinking_switch is not None:  # switched before the chat existed
                    self.store.set_thinking(self.current_id, self.thinking_switch)
                self.settings.last_conversation = self.current_id
                self.conversations_changed()
            state = "done" if self.ready else "queued"
            mid = self.store.add_message(self.current_id, "user", text, refs, state, parent)
        except (OSError, sqlite3.Error, StoreError) as e:
            self.notice(
                "error",
                tr("Your message could not be saved ({why}); it is still in the box below.").format(
                    why=e
                ),
            )
            return False
        if edited is not None:
            self.view.remove_from(edited)
            self.editing_id = None
        widget = self.view.add_message(
            mid,
            "user",
            text,
            [str(self.store.image_path(r)) for r in refs],
            [r.name for r in refs],
            state=state,
        )
        if edited is not None:
            self.show_versions(widget, message_id=mid)
        self.view.scroll_to_bottom()
        self.conversations_changed()
        if self.ready:
            self._start_answer()
        else:
            self.waiting_for_model = True
            self.notice("info", self._waiting_notice())
        self._update_actions()
        return True

    def _stored_image(self, attachment) -> ImageRef:
        """The attachment's copy in the store: the one made when it was attached (composer:
        no file work here, on the GUI thread), unless it has gone since; else made now."""
        ref = getattr(attachment, "stored", None)
        if isinstance(ref, ImageRef) and self.store.keep_image(ref):
            return ref
        return self.store.import_image(attachment.path, attachment.name)

    def turns(self, rows: list[MessageRow]) -> list[Turn]:
        turns, dropped = prompt_turns(rows, self.store.image_path)
        if dropped:  # older images that are gone are left out, with a notice
            self.notice("info", missing_images_notice(dropped, self.tr))
        return turns

    def _start_answer(self, after: int | None = None) -> None:
        """Answer the path shown (up to message `after`, for a regenerate)."""
        tr = self.tr
        cid = self.current_id
        rows = self.store.messages(cid)
        if after is not None:
            rows = rows[: 1 + next(i for i, r in enumerate(rows) if r.id == after)]
        job = GenerationJob(
            next(self._job_ids),
            self.turns(rows),
            self.settings.generation_options(),
            conversation_id=cid,
            image_names={
                str(self.store.image_path(ref)): ref.name for r in rows for ref in r.images
            },
        )
        job.options.thinking = thinking_mode(self.model, self.thinking_switch)
        try:
            mid = self.store.add_message(cid, "assistant", "", (), "streaming", rows[-1].id)
        except (sqlite3.Error, StoreError) as e:
            self.notice("error", tr("The chat store failed: {why}").format(why=e))
            return
        widget = self.view.add_message(mid, "assistant", "", state="streaming")
        if after is not None:
            self.show_versions(widget, message_id=mid)
        self.answer = Answer(job, cid, mid, widget)
        self.stats.spec_mode, self.stats.spec_k = self.settings.spec_mode, self.settings.spec_k
        self.stats.start(time.perf_counter())
        self.composer.set_busy(True)
        self._update_actions()
        self.busy_changed(True)
        self.engine.generate(job)

    # ---- streaming -----------------------------------------------------------------------

    def on_event(self, job_id: int, event) -> None:
        a = self.answer
        if a is None or a.job.job_id != job_id:
            return
        if isinstance(event, Tokens):
            a.thought.add(event.reasoning, event.text, event.reasoning_ids)
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
            self._add_notice(a, trim_notice(len(event.dropped), self.tr))
        elif isinstance(event, Finished):
            for text in event.notices:
                if text and text != a.trim_notice:
                    self._add_notice(a, text)
            self._finish(event.reason, event)

    def _add_notice(self, a: Answer, text: str) -> None:
        if text not in a.notices:
            a.notices.append(text)
            if a.widget is not None:
                a.widget.set_notices(a.notices)

    def on_failed(self, job_id: int, message: str) -> None:
        tr = self.tr
        a = self.answer
        if a is None or a.job.job_id != job_id:
            return
        self._finish("error", None, tr("The answer failed: {why}").format(why=message))

    def on_job_done(self, job_id: int) -> None:
        tr = self.tr
        a = self.answer
        if a is not None and a.job.job_id == job_id:  # ended without Finished: keep the text
            self._finish("error", None, tr("The engine stopped without finishing the answer."))

    def flush(self) -> None:
        """Show the text streamed since the last flush; commit it now and then."""
        a = self.answer
        if a is None:
            return
        if a.thought.active and a.widget is not None and a.shown_thought.changed(a.thought):
            a.widget.set_reasoning(a.thought.text, a.thought.seconds(), a.thought.streaming)
        if a.dirty and a.widget is not None:
            a.widget.stream(a.text)
            a.dirty = False
        changed = a.text != a.committed_text or len(a.thought.text) != a.committed_reasoning
        if changed and time.monotonic() - a.committed_at >= COMMIT_S:
            self._commit(a)

    def commit_streaming(self) -> None:
        """The answer streaming now, as far as it has come, into the store (an export reads
        the store)."""
        if self.answer is not None:
            self._commit(self.answer)

    def _commit(self, a: Answer, state: str | None = None, stats: dict | None = None) -> None:
        tr = self.tr
        try:
            reasoning = a.thought.text if a.thought.active else None
            self.store.update_message(a.message_id, a.text, state, stats, reasoning)
            a.committed_text, a.committed_reasoning = a.text, len(a.thought.text)
        except (sqlite3.Error, StoreError) as e:
            self.notice("error", tr("The answer could not be saved: {why}").format(why=e))
        a.committed_at = time.monotonic()

    def _finish(self, reason: str, done: Finished | None, error: str = "") -> None:
        a = self.answer
        if a is None:
            return
        state = STATE_OF_REASON.get(reason, "done")
        a.thought.end()
        stats = answer_stats(done, a, self.stats, reason)
        if error:
            stats["error"] = error
        self._commit(a, state, stats)
        if a.widget is not None:
            a.widget.finish(a.text, state, stats, error)
            if a.thought.active:
                a.widget.set_reasoning(a.thought.text, a.thought.seconds(), False)
        self.answer = None
        self.stats.finished(reason, done.tokens_per_s if done is not None else None)
        self.composer.set_busy(False)
        self._update_actions()
        if error:
            self.notice("error", error)
        self.busy_changed(False)
        self.answer_finished(state)
        pending, self._after_answer = self._after_answer, []
        for action in pending:
            action()

    def stop(self) -> None:
        if self.answer is not None:
            self.answer.job.cancel.set()
            self.stopped()  # the sent images' encodes too, if still running

    def when_idle(self, action: Callable[[], None]) -> None:
        """Run now, or after the current answer ends (stopping it)."""
        if self.answer is None:
            action()
        else:
            self._after_answer.append(action)
            self.stop()

    # ---- edit (regenerate and versions: branching.py) ------------------------------------

    def edit_target(self, message_id: int) -> MessageRow | None:
        """Start editing user message `message_id` (None: it cannot be edited now); the
        binding puts its text and images in the composer."""
        if self.answer is not None or self.current_id is None:
            return None
        row = next((r for r in self.store.messages(self.current_id) if r.id == message_id), None)
        if row is None or row.role != "user":
            return None
        self.editing_id = message_id
        return row

    def cancel_edit(self) -> None:
        self.editing_id = None

    # ---- saved sessions ------------------------------------------------------------------

    def _prepare_session(self) -> None:
        """Let the engine switch to the session of the conversation shown (restoring it from
        disk now, not when the next question arrives); None releases the previous one."""
        if not self.ready:
            return
        cid = self.current_id
        rows = self.store.messages(cid) if cid is not None else []
        self.engine.prepare(SessionJob(cid, self.turns(rows), self.settings.generation_options()))

    def set_session_cap(self, cap_bytes: int) -> None:
        self.engine.set_session_cap(max(0, int(cap_bytes)))

    def on_session_report(self, report: SessionReport) -> None:
        tr = self.tr
        if report.action in ("restored", "not_restored"):
            self.last_restore = report
            if report.reason and report.action == "not_restored":
                log.info("chat %s is recomputed: %s", report.conversation_id, report.reason)
        else:
            self.last_save = report
            if report.action == "not_saved" and report.reason:
                self.notice(
                    "info",
                    tr("This chat's session was not saved for quick continuation: {why}").format(
                        why=report.reason
                    ),
                )
        self.session(report)

    # ---- conversations -------------------------------------------------------------------

    def open_conversation(self, conversation_id: int | None) -> None:
        def do():
            nonlocal conversation_id
            if conversation_id is not None and self.store.conversation(conversation_id) is None:
                conversation_id = None  # deleted while this waited for an answer to stop
            if self.editing_id is not None:
                self.composer.leave_edit()
                self.editing_id = None
            self.current_id = conversation_id
            self.settings.last_conversation = conversation_id or 0
            self.thinking_switch = self.store.thinking(conversation_id) if conversation_id else None
            self.thinking_changed(self.thinking_switch)
            self.view.clear()
            self.view.set_more_above(False)
            self._opening = next(self._opened)
            self._more_above = None
            if conversation_id is not None:
                rows = self.store.messages(conversation_id)
                self._shown_count = min(len(rows), SHOWN_AT_OPEN)
                for r in rows[-SHOWN_AT_OPEN:]:
                    self._show_row(r)
                self.view.scroll_to_bottom()
                opening, older = self._opening, rows[:-SHOWN_AT_OPEN]
                if older:
                    self.later(lambda: self._show_older(opening, older))
            self._update_actions()
            self._prepare_session()
            self._answer_waiting()

        self.when_idle(do)

    def _show_older(self, opening: int, rows: list[MessageRow]) -> None:
        """Show `rows` (the chat's older messages, oldest first) above those shown, the newest
        OLDER_BATCH at a time, one batch an event-loop turn (later) until AUTO_SHOWN are shown,
        then one batch each time the view asks (show_more_above): rendering a long chat's
        every message at once had frozen the window for seconds. Stops if the chat shown
        changed (another opening) meanwhile."""
        if opening != self._opening:
            return
        for r in reversed(rows[-OLDER_BATCH:]):
            self._show_row(r, at_top=True)
            self._shown_count += 1
        self._update_actions()
        rest = rows[:-OLDER_BATCH]
        self._more_above = (opening, rest) if rest and self._shown_count >= AUTO_SHOWN else None
        self.view.set_more_above(self._more_above is not None)
        if rest and self._more_above is None:
            self.later(lambda: self._show_older(opening, rest))

    def show_more_above(self) -> None:
        """The reader scrolled near the oldest message shown: the next older batch."""
        if self._more_above is not None:
            opening, rows = self._more_above
            self._more_above = None
            self._show_older(opening, rows)

    def new_conversation(self) -> None:
        self.open_conversation(None)
        self.conversations_changed()

    def rename_conversation(self, conversation_id: int, name: str) -> None:
        """A store that fails (a full disk) says so; the list shows the name kept."""
        try:
            self.store.rename_conversation(conversation_id, name.strip()[:200])
        except (sqlite3.Error, StoreError) as e:
            self.notice("error", self.tr("The chat was not renamed: {why}").format(why=e))
        self.conversations_changed()

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a chat; an answer streaming in it is stopped first, one streaming in
        another chat goes on."""

        def do():
            try:
                self.store.delete_conversation(conversation_id)
            except (sqlite3.Error, StoreError) as e:
                self.notice("error", self.tr("The chat was not deleted: {why}").format(why=e))
                return
            self.engine.forget(conversation_id)
            if conversation_id == self.current_id:
                self.open_conversation(None)
            self.conversations_changed()

        if self.answer is not None and self.answer.conversation_id != conversation_id:
            do()  # (an opening of this chat waiting for the answer to stop opens none)
        else:
            self.when_idle(do)

    def set_thinking(self, switch: str | None) -> None:
        """The user's thinking switch for the chat shown (kept with it in the store; a store
        that fails says so, and the switch still holds for this chat while it is open)."""
        self.thinking_switch = switch if switch in ("on", "off") else None
        if self.current_id is not None:
            try:
                self.store.set_thinking(self.current_id, self.thinking_switch)
            except (sqlite3.Error, StoreError) as e:
                self.notice("error", self.tr("The chat store failed: {why}").format(why=e))

    def _show_row(self, r: MessageRow, at_top: bool = False):
        widget = self.view.add_message(
            r.id,
            r.role,
            r.text,
            [str(self.store.image_path(ref)) for ref in r.images],
            [ref.name for ref in r.images],
            state=r.state,
            stats=r.stats,
            error=r.stats.get("error", "") if r.state == "error" else "",
            at_top=at_top,
        )
        self.show_versions(widget, r)
        if r.reasoning is not None and widget is not None:  # a thinking model's answer
            widget.set_reasoning(r.reasoning, float(r.stats.get("thinking_s") or 0), False)
        return widget

    def _update_actions(self) -> None:
        self.view.update_actions(busy=self.answer is not None)

    # ---- shutdown ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """A streaming answer is saved as stopped; loading is cancelled."""
        a = self.answer
        if a is not None:
            a.job.cancel.set()
            self._commit(a, "stopped", {"reason": "cancelled", "tokens": self.stats.tokens})
            self.answer = None
        if self.loading is not None:
            self.loading.cancel.set()


def trim_notice(n_dropped: int, tr=lambda text: text) -> str:
    return tr(
        "The conversation no longer fits in the context budget: the {n} oldest message(s) are "
        "left out of what the model sees (they stay in the chat)."
    ).format(n=n_dropped)


def title(text: str, has_images: bool, tr=lambda text: text) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        return tr("Image chat") if has_images else tr("New chat")
    return first if len(first) <= 48 else first[:47].rstrip() + "…"
