"""Export, import and copy through the real window's Chat menu (offscreen, demo checkpoint),
a thinking answer's reasoning in them (never in the copied answer), and the shortcut list in
Help covering every action that has a shortcut."""

import base64
import json
import os
import threading
import time

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from test_thinking_app import _fake_engine, _feed, _tokens

from merlin.app.model import chat_export
from merlin.app.model.store import Store
from merlin.app.widgets import chat_files
from merlin.app.widgets.background import BackgroundJob
from merlin.engine.generate import Finished


def test_export_import_and_copy_a_chat(qtbot, make_window, tmp_path):
    w = make_window()
    send(qtbot, w, "What is in the picture?")
    cid = w.controller.current_id
    answer = w.store.messages(cid)[-1].text

    out = chat_files.export_chat(w, str(tmp_path / "chat.json")).wait()
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["conversations"][0]["messages"][-1]["text"] == answer
    md = chat_files.export_chat(w, str(tmp_path / "chat.md")).wait()
    assert "What is in the picture?" in md.read_text(encoding="utf-8")
    assert "What is in the picture?" in chat_files.copy_markdown(w).wait()
    assert "What is in the picture?" in QApplication.clipboard().text()

    before = len(w.store.conversations())
    ids = chat_files.import_chats(w, str(out)).wait()
    assert len(ids) == 1 and len(w.store.conversations()) == before + 1
    assert w.store.messages(ids[0])[-1].text == answer
    assert w.conversations.list.count() == before + 1
    assert w.notice_banner.isVisible() and "Imported 1" in w.notice_banner.label.text()

    every = chat_files.export_all(w, str(tmp_path / "all.json")).wait()
    assert len(json.loads(every.read_text(encoding="utf-8"))["conversations"]) == before + 1


def test_an_export_reads_the_store_off_the_gui_thread(qtbot, make_window, tmp_path, monkeypatch):
    """An export reads every chat's rows on the job's thread through a connection of its own
    (Store.reader; 101 chats of 30,000 messages took 1.4 s on the GUI thread). An import
    adds its chats there too, through a writing connection of its own (Store.writer; in
    short transactions, model/store_import.py: the window's writes never wait long)."""
    w = make_window()
    send(qtbot, w, "What is in the picture?")
    threads = []
    messages, add = Store.messages, Store.add_conversations

    def reading(self, cid):
        threads.append(("read", threading.current_thread()))
        return messages(self, cid)

    def adding(self, convs):
        threads.append(("add", threading.current_thread()))
        assert self is not w.store and self._db is not w.store._db
        return add(self, convs)

    monkeypatch.setattr(Store, "messages", reading)
    monkeypatch.setattr(Store, "add_conversations", adding)
    out = chat_files.export_all(w, str(tmp_path / "all.json")).wait()
    ids = chat_files.import_chats(w, str(out)).wait()
    assert [kind for kind, _ in threads] == ["read", "add"]
    assert threads[0][1] is not threading.main_thread()
    assert threads[1][1] is not threading.main_thread()
    assert len(ids) == 1 and w.store.messages(ids[0])[0].text == "What is in the picture?"
    assert w.conversations.list.count() == 2


def test_copy_as_markdown_reads_the_chat_off_the_gui_thread(qtbot, make_window, monkeypatch):
    """Copy chat as Markdown reads the rows on its job's thread from a connection of its own
    (a 10,000-message chat took 0.26 s on the GUI thread); a chat deleted before the copy is
    read says so and leaves the clipboard alone."""
    w = make_window()
    send(qtbot, w, "What is in the picture?")
    readers = []
    markdown = chat_export.conversation_markdown

    def reading(store, cid):
        readers.append((threading.current_thread(), store is w.store))
        return markdown(store, cid)

    monkeypatch.setattr(chat_export, "conversation_markdown", reading)
    copied = chat_files.copy_markdown(w).wait()
    assert "What is in the picture?" in copied and QApplication.clipboard().text() == copied
    ((thread, own_store),) = readers
    assert thread is not threading.main_thread() and not own_store

    QApplication.clipboard().setText("kept")
    notices = []
    monkeypatch.setattr(w, "on_notice", lambda kind, text: notices.append((kind, text)))
    deleted = threading.Event()

    def reading_late(store, cid):
        assert deleted.wait(10)
        return markdown(store, cid)

    monkeypatch.setattr(chat_export, "conversation_markdown", reading_late)
    job = chat_files.copy_markdown(w)
    w.store.delete_conversation(w.controller.current_id)
    deleted.set()
    assert job.wait() == ""
    assert QApplication.clipboard().text() == "kept" and notices[-1][0] == "info"


def test_a_database_error_in_a_copy_or_export_is_a_notice(
    qtbot, make_window, tmp_path, monkeypatch
):
    """SQLite's own errors from a job's read-only connection (opened and read raw) are notices
    like a file's, not exceptions on the GUI thread; nothing is copied or written."""
    import sqlite3

    w = make_window()
    send(qtbot, w, "What is in the picture?")
    notices = []
    monkeypatch.setattr(w, "on_notice", lambda kind, text: notices.append((kind, text)))

    def broken(self):
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(Store, "reader", broken)
    QApplication.clipboard().setText("kept")
    assert chat_files.copy_markdown(w).wait() == ""
    assert QApplication.clipboard().text() == "kept"
    assert notices[-1] == ("error", "The chat was not copied: database disk image is malformed")
    assert chat_files.export_chat(w, str(tmp_path / "chat.md")).wait() is None
    assert not (tmp_path / "chat.md").exists() and "malformed" in notices[-1][1]


def test_reasoning_goes_with_the_chat_never_with_the_copied_answer(qtbot, make_window, tmp_path):
    w = make_window()
    jobs = _fake_engine(w)
    send(qtbot, w, "Why is the sky blue?", wait=False)
    qtbot.waitUntil(lambda: len(jobs) == 1)
    reasoning = "Light <b>scatters</b>; </details> is text."
    _feed(w, jobs[0], [_tokens(reasoning=reasoning, n_reasoning=9)])
    _feed(w, jobs[0], [_tokens(text="Rayleigh scattering."), Finished("stop_token", reasoning="x")])
    qtbot.waitUntil(lambda: not w.controller.busy)
    answer = w.chat.messages()[-1]
    answer.copy_button.click()  # Copy message: the answer alone
    assert QApplication.clipboard().text() == "Rayleigh scattering."
    copied = chat_files.copy_markdown(w).wait()  # Copy chat as Markdown: the reasoning folded
    assert QApplication.clipboard().text() == copied
    block = "<details>\n<summary>Thinking</summary>\n\n> Light \\<b>scatters\\</b>; \\</details>"
    assert block in copied
    assert copied.index("</details>\n\nRayleigh scattering.") > copied.index(block)
    md = chat_files.export_chat(w, str(tmp_path / "sky.md")).wait()
    assert md.read_text(encoding="utf-8") == copied
    # JSON: out and back in, the imported chat shows the reasoning apart from its answer
    out = chat_files.export_chat(w, str(tmp_path / "sky.json")).wait()
    assert json.loads(out.read_text("utf-8"))["conversations"][0]["messages"][1]["reasoning"] == (
        reasoning
    )
    (new,) = chat_files.import_chats(w, str(out)).wait()
    assert w.store.messages(new)[-1].reasoning == reasoning
    w.controller.open_conversation(new)
    qtbot.waitUntil(lambda: len(w.chat.messages()) == 2)
    shown = w.chat.messages()[-1]
    assert shown.text == "Rayleigh scattering." and shown.reasoning is not None
    shown.reasoning.set_expanded(True)
    assert shown.reasoning.body.toPlainText() == reasoning


def test_a_bad_import_is_a_notice_and_changes_nothing(qtbot, make_window, tmp_path):
    w = make_window()
    send(qtbot, w, "hello")
    before = [(c.id, c.title) for c in w.store.conversations()]
    bad = tmp_path / "notes.json"
    bad.write_text(
        '{"format": "merlin-chats", "version": 1, "conversations": [{"title": 1', "utf-8"
    )
    assert chat_files.import_chats(w, str(bad)).wait() == []
    assert (
        w.notice_banner.kind == "error" and "Nothing was imported" in w.notice_banner.label.text()
    )
    assert [(c.id, c.title) for c in w.store.conversations()] == before
    assert bad.read_text("utf-8").startswith('{"format"')  # the user's file is untouched


def test_an_import_with_an_enormous_number_is_a_notice(qtbot, make_window, tmp_path):
    """Numbers no float holds, or too long for Python to read, are refused with a message."""
    w = make_window()
    before = [(c.id, c.title) for c in w.store.conversations()]
    huge, long = "1" + "0" * 400, "1" + "0" * 5000
    chat = f'{{"title": "t", "created": {huge}, "messages": []}}'
    files = {
        "created.json": f'{{"format": "merlin-chats", "version": 2, "conversations": [{chat}]}}',
        "version.json": f'{{"format": "merlin-chats", "version": {long}, "conversations": []}}',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, "utf-8")
        assert chat_files.import_chats(w, str(tmp_path / name)).wait() == [], name
        shown = w.notice_banner.label.text()
        assert w.notice_banner.kind == "error" and "Nothing was imported" in shown, name
    assert [(c.id, c.title) for c in w.store.conversations()] == before


def test_export_without_a_chat_says_so(qtbot, make_window, tmp_path):
    w = make_window()
    w.new_chat()
    assert chat_files.export_chat(w, str(tmp_path / "x.json")) is None
    assert not (tmp_path / "x.json").exists()
    assert w.notice_banner.isVisible()


def test_export_never_replaces_a_file_under_a_name_it_added(qtbot, make_window, tmp_path):
    """The dialog asked about the name as typed ("backup"); the suffix added after it must not
    replace an existing backup.json / report.md without asking."""
    w = make_window()
    send(qtbot, w, "hello")
    for typed, existing, action in (
        ("backup", "backup.json", chat_files.export_all),
        ("report", "report.md", chat_files.export_chat),
        ("notes.txt", "notes.txt.md", chat_files.export_chat),
    ):
        (tmp_path / existing).write_text("the user's own file")
        assert action(w, str(tmp_path / typed)) is None
        assert (tmp_path / existing).read_text() == "the user's own file"
        assert "already exists" in w.notice_banner.label.text()
        (tmp_path / existing).unlink()
        out = action(w, str(tmp_path / typed)).wait()  # free: written under the added name
        assert out == tmp_path / existing and out.stat().st_size > 0
    replaced = tmp_path / "asked.json"  # typed with its suffix: the dialog asked
    replaced.write_text("old")
    assert chat_files.export_all(w, str(replaced)).wait() == replaced
    assert replaced.read_text() != "old"


def _gated(monkeypatch, module, name):
    """module.name waits for the returned event before it runs (on the job's thread)."""
    gate, entered = threading.Event(), threading.Event()
    real = getattr(module, name)

    def gated(*args, **kwargs):
        entered.set()
        assert gate.wait(30), "the test never opened the gate"
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, gated)
    return gate, entered


def _import_held_up(qtbot, make_window, tmp_path, monkeypatch):
    """A window that imports its own export (one chat), held up on the job's thread while it
    reads the file: (window, chats before, the gate that lets it go on, the job)."""
    w = make_window()
    send(qtbot, w, "hello")
    out = chat_files.export_all(w, str(tmp_path / "all.json")).wait()
    before = len(w.store.conversations())
    gate, entered = _gated(monkeypatch, chat_export, "read_json")
    job = chat_files.import_chats(w, str(out))
    assert entered.wait(10)
    return w, before, gate, job


def test_an_import_runs_beside_a_responsive_window(qtbot, make_window, tmp_path, monkeypatch):
    """Reading a big backup (hundreds of MB of pictures: seconds) no longer freezes the window:
    the GUI thread keeps handling events while the file is read, one file job at a time."""
    w, before, gate, job = _import_held_up(qtbot, make_window, tmp_path, monkeypatch)
    assert job.running
    assert "Importing chats from" in w.notice_banner.label.text()
    ticks = []
    QTimer.singleShot(0, lambda: ticks.append(1))
    qtbot.waitUntil(lambda: ticks == [1])  # the event loop runs while the file is read
    assert not w.act_import.isEnabled() and not w.act_export_all.isEnabled()
    assert chat_files.export_all(w, str(tmp_path / "again.json")) is None  # one at a time
    assert "still running" in w.notice_banner.label.text()
    assert len(w.store.conversations()) == before
    gate.set()
    qtbot.waitUntil(lambda: not job.running)
    assert len(job.result) == before and len(w.store.conversations()) == 2 * before
    assert w.act_import.isEnabled() and "Imported" in w.notice_banner.label.text()


def test_closing_the_window_finishes_a_running_import(qtbot, make_window, tmp_path, monkeypatch):
    w, before, gate, job = _import_held_up(qtbot, make_window, tmp_path, monkeypatch)
    threading.Timer(0.3, gate.set).start()
    w.close()  # waits for the import, adds its chats, then closes the store
    assert not job.running and len(job.result) == before
    store = Store(w.store.folder)
    try:
        assert len(store.conversations()) == 2 * before
    finally:
        store.close()


def test_a_chat_deleted_during_its_export_keeps_its_pictures_in_the_file(
    qtbot, make_window, tmp_path, monkeypatch
):
    w = make_window()
    ref = w.store.import_image_bytes(b"\x89PNG a picture", "png", "p.png")
    cid = w.store.create_conversation("pictures")
    w.store.add_message(cid, "user", "look", [ref])
    w.controller.open_conversation(cid)
    qtbot.waitUntil(lambda: w.controller.current_id == cid)
    old = time.time() - 3600  # long past the image collection's grace period
    os.utime(w.store.image_path(ref), (old, old))
    gate, entered = _gated(monkeypatch, chat_export, "_embedded")
    job = chat_files.export_chat(w, str(tmp_path / "p.json"))
    assert entered.wait(10)
    w.store.delete_conversation(cid)
    assert w.store.image_path(ref).exists()  # held while the export reads it
    gate.set()
    out = job.wait()
    image = json.loads(out.read_text("utf-8"))["conversations"][0]["messages"][0]["images"][0]
    assert base64.b64decode(image["data"]) == b"\x89PNG a picture"
    assert not w.store.image_path(ref).exists()  # collected once the export was over


def test_a_background_job_raises_what_it_does_not_handle(qtbot, make_window):
    """A bug in the work is not swallowed: failed() returning NotImplemented re-raises it on
    the GUI thread (as if it had run there); done() runs once however it is delivered."""
    w = make_window(wait=False)
    done = []

    def broken():
        raise KeyError("a bug")

    job = BackgroundJob(w, broken, done.append, lambda e: NotImplemented)
    with pytest.raises(KeyError):
        job.wait()
    job = BackgroundJob(w, lambda: 7, done.append, lambda e: None)
    qtbot.waitUntil(lambda: not job.running)
    job.wait()
    QApplication.processEvents()
    assert done == [7]


def test_every_action_with_a_shortcut_is_listed_in_help(qtbot, make_window):
    w = make_window(wait=False)
    rows = dict(w.shortcut_rows())
    listed = set(rows)
    for a in w.findChildren(type(w.act_new)):
        if not a.shortcut().isEmpty():
            assert a.shortcut().toString() in listed, a.text()
    for keys in ("Ctrl+N", "Ctrl+O", "Ctrl+E", "Ctrl+I", "F1", "F9", "F10", "F11", "Esc"):
        assert keys in listed


def test_a_search_without_a_match_says_so(qtbot, make_window):
    w = make_window()
    send(qtbot, w, "hello")
    w.conversations.search.setText("zzz-no-such-chat")
    qtbot.waitUntil(lambda: w.conversations.list.count() == 0, timeout=5000)
    label = w.conversations.empty_label
    assert label.isVisible() and "zzz-no-such-chat" in label.text()
    w.conversations.search.setText("")
    qtbot.waitUntil(lambda: w.conversations.list.count() > 0, timeout=5000)
    assert not label.isVisible()
