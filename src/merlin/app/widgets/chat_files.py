"""The Chat menu's export, import and copy actions: file dialogs and notices around the
Qt-free merlin.app.model.chat_export. Every failure is a notice in the window; nothing in
the store changes unless an import succeeds whole."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtWidgets import QApplication, QFileDialog

from merlin.app.i18n import tr
from merlin.app.model import chat_export
from merlin.app.model.chat_export import ChatFileError
from merlin.app.model.store import StoreError

JSON_FILTER = "JSON (*.json)"
MARKDOWN_FILTER = "Markdown (*.md)"


def _safe_name(title: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title).strip()
    return keep[:60] or "chat"


def export_chat(window, path: str | None = None) -> Path | None:
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
    try:
        if as_json:
            out = chat_export.write_json(window.store, [cid], target)
        else:
            out = chat_export.write_markdown(window.store, cid, target)
    except (OSError, ChatFileError, StoreError) as e:
        window.on_notice("error", tr("The chat was not exported: {why}").format(why=_why(e)))
        return None
    window.on_notice("info", tr("Exported to {path}").format(path=out))
    return out


def export_all(window, path: str | None = None) -> Path | None:
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
    try:
        out = chat_export.write_json(window.store, ids, target)
    except (OSError, ChatFileError, StoreError) as e:
        window.on_notice("error", tr("The chats were not exported: {why}").format(why=_why(e)))
        return None
    window.on_notice("info", tr("Exported {n} chats to {path}").format(n=len(ids), path=out))
    return out


def import_chats(window, path: str | None = None) -> list[int]:
    """Chats from a JSON export, added beside the existing ones (never merged or replaced)."""
    if path is None:
        path, _ = QFileDialog.getOpenFileName(
            window, tr("Import chats"), str(Path.home()), JSON_FILTER
        )
        if not path:
            return []
    try:
        convs = chat_export.read_json(path)
        ids = chat_export.import_conversations(window.store, convs)
    except (ChatFileError, StoreError, OSError) as e:
        window.on_notice("error", tr("Nothing was imported: {why}").format(why=_why(e)))
        return []
    window.refresh_conversations()
    message = tr("Imported {n} chats from {path}").format(n=len(ids), path=path)
    missing = sum(m.missing_images for c in convs for m in c.messages)
    if missing:
        message += " " + tr(
            "{n} pictures were already missing when the chats were exported; they are left out."
        ).format(n=missing)
    window.on_notice("info", message)
    return ids


def copy_markdown(window) -> str:
    """The chat on screen as Markdown on the clipboard."""
    cid = window.controller.current_id
    text = chat_export.conversation_markdown(window.store, cid) if cid else ""
    if not text:
        window.on_notice("info", tr("Open a chat to copy it."))
        return ""
    QApplication.clipboard().setText(text)
    return text


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


def _why(e: Exception) -> str:
    if isinstance(e, OSError):
        return f"{e.filename or ''} {e.strerror or e}".strip()
    return str(e)
