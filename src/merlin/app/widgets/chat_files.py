"""The Chat menu's export, import and copy actions: file dialogs and notices around the
Qt-free merlin.app.model.chat_export. Every failure is a notice in the window; nothing in
the store changes unless an import succeeds whole.

Reading and writing the file (pictures embedded: hundreds of MB) and an export's reading of
the store's rows run on a thread of its own (widgets/background.py; the rows through a
read-only connection of its own, Store.reader: in WAL mode reading never blocks the window's
writes), one import or export at a time, the window responsive meanwhile. An import adds its
chats on that thread too, through a connection of its own (Store.writer) in short
transactions, hidden until the last, letting the window's own writes (a streamed answer's
saves) go first between them (model/store_import.py); a store in memory is written on the
GUI thread.
The store's image collection is held while a job runs. export_chat, export_all
and import_chats return the job (None when nothing started); job.wait() gives what the
synchronous form would have returned: the file written, the imported chats' ids. Copying a
chat as Markdown reads it off the GUI thread too (copy_markdown), beside any such job."""

from __future__ import annotations

import os
import sqlite3
from functools import partial
from pathlib import Path

from PySide6.QtWidgets import QApplication, QFileDialog

from merlin.app.i18n import tr
from merlin.app.model import chat_export
from merlin.app.model.chat_export import ChatFileError
from merlin.app.model.store import StoreError
from merlin.app.widgets.background import BackgroundJob

JSON_FILTER = "JSON (*.json)"
MARKDOWN_FILTER = "Markdown (*.md)"


def _safe_name(title: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title).strip()
    return keep[:60] or "chat"


def export_chat(window, path: str | None = None) -> BackgroundJob | None:
    """The chat on screen to JSON or Markdown (by the file's suffix)."""
    cid = window.controller.current_id
    row = window.store.conversation(cid) if cid else None
    if row is None:
        window.on_notice("info", tr("Open a chat to export it."))
        return None
    if path is None:
        path, _ = QFileDialog.getSaveFileName(
            window,
            tr("Export chat"),
            str(Path.home() / f"{_safe_name(row.title)}.md"),
            f"{MARKDOWN_FILTER};;{JSON_FILTER}",
        )
        if not path:
            return None
    target = Path(path)
    as_json = target.suffix.lower() == ".json"
    target = _named(window, target, ".json" if as_json else ".md")
    if target is None:
        return None

    def write(store):
        if as_json:
            return partial(chat_export.json_export(store, [cid]).write, target)
        return chat_export.markdown_export(store, cid, target).write

    return _export(
        window,
        target,
        write,
        tr("The chat was not exported: {why}"),
        lambda out: tr("Exported to {path}").format(path=out),
    )


def export_all(window, path: str | None = None) -> BackgroundJob | None:
    """Every chat to one JSON file (images embedded)."""
    ids = [row.id for row in window.store.conversations()]
    if not ids:
        window.on_notice("info", tr("There are no chats to export yet."))
        return None
    if path is None:
        path, _ = QFileDialog.getSaveFileName(
            window, tr("Export all chats"), str(Path.home() / "merlin-chats.json"), JSON_FILTER
        )
        if not path:
            return None
    target = _named(window, Path(path), ".json")
    if target is None:
        return None
    return _export(
        window,
        target,
        lambda store: partial(chat_export.json_export(store, ids).write, target),
        tr("The chats were not exported: {why}"),
        lambda out: tr("Exported {n} chats to {path}").format(n=len(ids), path=out),
    )


def import_chats(window, path: str | None = None) -> BackgroundJob | None:
    """Chats from a JSON export, added beside the existing ones (never merged or replaced)."""
    if path is None:
        path, _ = QFileDialog.getOpenFileName(
            window, tr("Import chats"), str(Path.home()), JSON_FILTER
        )
        if not path:
            return None
    store = window.store

    def work():
        convs = chat_export.read_json(path)
        prepared = chat_export.store_images(store, convs)
        writer = store.writer()
        if writer is None:  # a store in memory: added on the GUI thread (done)
            return convs, prepared, None
        try:
            return convs, None, writer.add_conversations(prepared)
        finally:
            writer.close()

    def failed(e):
        if _failed(window, e, tr("Nothing was imported: {why}")) is NotImplemented:
            return NotImplemented
        return []

    def done(read):
        convs, prepared, ids = read
        if ids is None:
            try:
                ids = store.add_conversations(prepared)
            except StoreError as e:
                return failed(e)
        window.refresh_conversations()
        message = tr("Imported {n} chats from {path}").format(n=len(ids), path=path)
        missing = sum(m.missing_images for c in convs for m in c.messages)
        if missing:
            message += " " + tr(
                "{n} pictures were already missing when the chats were exported; they are left out."
            ).format(n=missing)
        window.on_notice("info", message)
        return ids

    started = tr("Importing chats from {path}…").format(path=path)
    return _start(window, started, work, done, failed)


def copy_markdown(window) -> BackgroundJob | None:
    """The chat on screen as Markdown on the clipboard, made off the GUI thread (a chat of
    thousands of messages takes a noticeable moment) from a read-only connection of its own;
    job.wait() gives the text copied ("" when the chat is gone)."""
    cid = window.controller.current_id
    if not cid:
        window.on_notice("info", tr("Open a chat to copy it."))
        return None
    if window.store.folder:

        def work():
            store = window.store.reader()
            try:
                return chat_export.conversation_markdown(store, cid)
            finally:
                store.close()

    else:  # a store in memory: read on the GUI thread
        text = chat_export.conversation_markdown(window.store, cid)

        def work():
            return text

    def done(text):
        if not text:
            window.on_notice("info", tr("Open a chat to copy it."))
            return ""
        QApplication.clipboard().setText(text)
        return text

    def failed(e):
        if _failed(window, e, tr("The chat was not copied: {why}")) is NotImplemented:
            return NotImplemented
        return ""

    return BackgroundJob(window, work, done, failed, "merlin-copy-markdown")


def _named(window, typed: Path, suffix: str) -> Path | None:
    """The file to write: the name as typed, or with `suffix` added when it has another. The
    file dialog asked before replacing only the typed name, so a file under the added name is
    never replaced: a notice asks for another name instead (None)."""
    if typed.suffix.lower() == suffix:
        return typed
    target = typed.with_name(typed.name + suffix)
    if os.path.lexists(target):
        window.on_notice(
            "error",
            tr("{path} already exists; nothing was exported. Choose another name.").format(
                path=target
            ),
        )
        return None
    return target


def _export(window, target: Path, plan, failure: str, success) -> BackgroundJob | None:
    """plan(store) reads what to export from the store and returns the writer of `target`;
    both run off the GUI thread; then the notice success(path), or failure with why. An
    answer streaming now goes in as far as it has come (its last commit could be empty)."""
    window.controller.conversation.commit_streaming()

    def failed(e):
        return _failed(window, e, failure)

    def done(out):
        window.on_notice("info", success(out))
        return out

    if window.store.folder:

        def write():
            store = window.store.reader()
            try:
                writer = plan(store)
            finally:
                store.close()
            return writer()

    else:  # a store in memory: read on the GUI thread
        try:
            write = plan(window.store)
        except (ChatFileError, StoreError) as e:
            failed(e)
            return None
    return _start(window, tr("Exporting to {path}…").format(path=target), write, done, failed)


def _start(window, started: str, work, done, failed) -> BackgroundJob | None:
    """Run work() off the GUI thread (the notice `started` shown), then done(result) or
    failed(error) on it: one job at a time (window.file_job), its actions disabled and the
    store's image collection held meanwhile."""
    if window.file_job is not None and window.file_job.running:
        window.on_notice("info", tr("An import or export is still running; wait for it."))
        return None

    def finish(handler):
        def over(value):
            try:  # an import's rows are added before its pictures may be collected
                return handler(value)
            finally:
                window.store.hold_images(False)
                _enable_file_actions(window, True)

        return over

    window.store.hold_images()
    _enable_file_actions(window, False)
    window.on_notice("info", started)
    window.file_job = BackgroundJob(window, work, finish(done), finish(failed), "merlin-chat-files")
    return window.file_job


def _enable_file_actions(window, enabled: bool) -> None:
    for action in (window.act_export, window.act_export_all, window.act_import):
        action.setEnabled(enabled)


def _failed(window, e: BaseException, message: str):
    """The notice for an export, import or copy that failed as files and stores do (SQLite's
    own errors included: a job's read-only connection is opened and read raw); anything else
    is a bug, raised (NotImplemented: background.py)."""
    if not isinstance(e, (OSError, ChatFileError, StoreError, sqlite3.Error)):
        return NotImplemented
    window.on_notice("error", message.format(why=_why(e)))
    return None


def _why(e: Exception) -> str:
    if isinstance(e, OSError):
        return f"{e.filename or ''} {e.strerror or e}".strip()
    return str(e)
