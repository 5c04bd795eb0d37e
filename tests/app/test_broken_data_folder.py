"""The app started on every broken data-folder state: it starts, says what is wrong in the
window, keeps the broken files unchanged, and (where the database is unusable) offers to
start a new chat history beside it. Each window loads the demo checkpoint and answers."""

from __future__ import annotations

import sqlite3

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)

OLD_LAYOUT = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL,
    role TEXT NOT NULL, text TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL);
INSERT INTO conversations VALUES (1, 'old chat', 0, 0);
INSERT INTO messages VALUES (1, 1, 'user', 'an old question', 0, 0);
"""


def _db(folder, sql: str, version: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(folder / "chats.sqlite3")
    db.executescript(sql)
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()


def state_garbage(folder):
    folder.mkdir(parents=True)
    (folder / "chats.sqlite3").write_bytes(b"not a database" * 100)


def state_foreign(folder):
    _db(
        folder, "CREATE TABLE photos (id INTEGER, path TEXT); INSERT INTO photos VALUES (1,'a');", 0
    )


def state_newer(folder):
    from merlin.app.model.store import _SCHEMA_V1

    _db(folder, _SCHEMA_V1, 99)


def state_old_layout(folder):
    _db(folder, OLD_LAYOUT, 1)


def state_old_layout_v0(folder):
    _db(folder, OLD_LAYOUT, 0)


def state_stats_list(folder):
    from merlin.app.model.store import Store

    s = Store(folder)
    cid = s.create_conversation("chat")
    mid = s.add_message(cid, "user", "q")
    s.add_message(cid, "assistant", "a")
    s._db.execute("UPDATE messages SET stats = '[1, 2, 3]' WHERE id = ?", (mid,))
    s.close()


def state_odd_figures_in_the_last_chat(folder):
    """An answer whose stored figures are of the wrong kind (a text for tokens/s, numbers as
    notices), in the chat the last window had open: opening it at start had raised, and the
    app could not start at all."""
    import json

    from merlin.app.model.store import Store

    s = Store(folder)
    cid = s.create_conversation("chat")
    s.add_message(cid, "user", "q")
    mid = s.add_message(cid, "assistant", "a")
    odd = {"tokens": 3, "tokens_per_s": "12.5", "notices": [1, 2], "drafted": [[0, "x"]]}
    s._db.execute("UPDATE messages SET stats = ? WHERE id = ?", (json.dumps(odd), mid))
    s.close()
    (folder / "settings.ini").write_text(f"[General]\nlast_conversation={cid}\n")


def state_bad_settings(folder):
    folder.mkdir(parents=True)
    (folder / "settings.ini").write_text(
        "[General]\nthreads=-5\nlast_conversation=99999999999999999999999999\n"
        "context_budget=99999999999999\ncpus=0-99999999999\nmax_new_tokens=nan\n"
    )


STATES = {
    "garbage database": (state_garbage, True),
    "foreign sqlite database": (state_foreign, True),
    "newer schema": (state_newer, True),
    "older layout without columns": (state_old_layout, False),
    "our tables without a version": (state_old_layout_v0, False),
    "stats column holds a list": (state_stats_list, False),
    "bad settings.ini": (state_bad_settings, False),
    "odd figures in the last chat": (state_odd_figures_in_the_last_chat, False),
}


@pytest.mark.parametrize("state", list(STATES))
def test_app_starts_on_broken_data_folder(qtbot, make_window, data_dir, state):  # noqa: F811
    make_state, unusable = STATES[state]
    make_state(data_dir)
    db = data_dir / "chats.sqlite3"
    before = db.read_bytes() if db.exists() else None
    w = make_window(saved=state in ("bad settings.ini", "odd figures in the last chat"))
    if unusable:
        assert "left as it is" in w.notice_banner.text()
        assert not w.notice_banner.action.isHidden()  # "Start a new chat history"
        assert db.read_bytes() == before  # untouched, no WAL switch
        assert not (data_dir / "chats.sqlite3-wal").exists()
        w.notice_banner.action.click()  # start a new history beside it
        moved = [p for p in data_dir.iterdir() if ".unreadable-" in p.name]
        assert moved and moved[0].read_bytes() == before
    if state == "bad settings.ini":
        assert "settings.ini" in w.notice_banner.text()
        assert w.settings.threads == 0 and w.settings.last_conversation == 0
    if state == "odd figures in the last chat":
        shown = w.chat.messages()
        assert [m.text for m in shown] == ["q", "a"] and "3 tokens" in shown[1].status.text()
    if state.startswith("older") or state.startswith("our tables"):
        assert any(r.title == "old chat" for r in w.store.conversations())
    send(qtbot, w, "hello")  # the app answers, and the answer is saved
    rows = w.store.messages(w.controller.current_id)
    assert rows[-1].role == "assistant" and rows[-1].state == "done"


def test_data_dir_that_is_a_file(qtbot, make_window, tmp_path, monkeypatch):  # noqa: F811
    target = tmp_path / "a-file"
    target.write_text("mine")
    monkeypatch.setenv("MERLIN_DATA_DIR", str(target))
    w = make_window()
    assert "is a file" in w.notice_banner.text()
    assert target.read_text() == "mine"
    send(qtbot, w, "hello")


def test_missing_image_of_an_old_message(qtbot, make_window, data_dir, tmp_path):  # noqa: F811
    from PIL import Image

    img = tmp_path / "red.png"
    Image.new("RGB", (64, 64), (220, 20, 20)).save(img)
    w = make_window()
    ref = w.store.import_image(img)
    cid = w.store.create_conversation("with image")
    w.store.add_message(cid, "user", "what is it?", [ref])
    w.store.add_message(cid, "assistant", "a red square")
    w.store.image_path(ref).unlink()  # the stored image is gone
    w.controller.open_conversation(cid)
    send(qtbot, w, "and now?")
    rows = w.store.messages(cid)
    assert rows[-1].role == "assistant" and rows[-1].state == "done"


def test_svg_attachment_is_converted(qtbot, data_dir, tmp_path):  # noqa: F811
    from merlin.app.widgets.attachments import read_image
    from merlin.engine.vision.image_file import open_image

    svg = tmp_path / "logo.svg"
    svg.write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="48">'
        '<rect width="64" height="48" fill="red"/></svg>'
    )
    a = read_image(svg)
    assert a.path.endswith(".png") and a.name == "logo.svg"
    assert open_image(a.path).size == (64, 48)  # the engine can read what is attached


def test_a_last_chat_that_cannot_be_shown_does_not_stop_the_app(
    qtbot,
    make_window,
    data_dir,
    monkeypatch,  # noqa: F811
):
    """Whatever makes the chat open last time fail to show, the window opens on no chat
    with a notice, the chat stays in the list, and the next start does not try it again."""
    from merlin.app.model.conversation import ConversationModel

    state_odd_figures_in_the_last_chat(data_dir)
    shown = ConversationModel._show_row

    def failing(self, *args, **kwargs):
        raise ValueError("a row this code cannot show")

    monkeypatch.setattr(ConversationModel, "_show_row", failing)
    w = make_window(saved=True)
    assert "could not be shown" in w.notice_banner.text()
    assert w.controller.current_id is None and w.settings.last_conversation == 0
    assert [r.title for r in w.store.conversations()] == ["chat"]
    monkeypatch.setattr(ConversationModel, "_show_row", shown)
    send(qtbot, w, "hello")  # a new chat answers
    assert len(w.store.conversations()) == 2


def test_a_new_chat_history_keeps_what_was_written_before_it(qtbot, make_window, data_dir):  # noqa: F811
    """On a database Merlin cannot use, chats go to a store in memory and no draft is kept.
    Starting a new history moved nothing across: the chat written meanwhile was gone and its
    next message said another window had deleted it, and the unsent text was never kept on
    disk for the rest of the run. Now the chats go into the new history, the one shown stays
    shown, and the drafts are kept from then on (the last run's wait on disk while the box
    holds something: the next start merges them)."""
    from merlin.app.model.draft import DRAFTS_DIR, Draft, write_draft_file
    from merlin.app.model.store import Store

    state_newer(data_dir)
    (data_dir / DRAFTS_DIR).mkdir()
    write_draft_file(data_dir / DRAFTS_DIR / "gone.json", Draft("left from yesterday"))
    w = make_window()
    assert w.composer.text() == ""  # no draft while chats are not kept on disk
    send(qtbot, w, "a first question")
    w.composer.set_text("typed before pressing the button")
    w.notice_banner.action.click()
    assert "new chat history was started" in w.notice_banner.text()
    assert [r.title for r in w.store.conversations()] == ["a first question"]
    cid = w.controller.current_id
    assert [m.text for m in w.chat.messages()][0] == "a first question"
    assert [r.text for r in w.store.messages(cid)][0] == "a first question"
    assert w.composer.text() == "typed before pressing the button"  # as it was
    send(qtbot, w, "a follow-up")
    rows = w.store.messages(cid)
    assert [r.text for r in rows if r.role == "user"] == ["a first question", "a follow-up"]
    w.composer.set_text("unsent at close")
    w.close()
    reopened = Store(data_dir)
    assert [len(reopened.messages(c.id)) for c in reopened.conversations()] == [4]
    reopened.close()
    again = make_window()
    assert again.composer.text() == "left from yesterday\n\nunsent at close"


def test_no_new_history_while_an_answer_streams(
    qtbot,
    make_window,
    data_dir,
    monkeypatch,  # noqa: F811
):
    import threading

    from merlin.engine.generate import Finished

    state_newer(data_dir)
    w = make_window()
    worker, answering = w.controller.worker, threading.Event()

    def held_answer(job):  # an answer that goes on until the test lets it end
        answering.wait(30)
        worker.sig_event.emit(job.job_id, Finished("stop_token", generated_tokens=1))

    monkeypatch.setattr(worker, "_answer", held_answer)
    send(qtbot, w, "a question", wait=False)
    qtbot.waitUntil(lambda: w.controller.busy, timeout=10_000)
    w.notice_banner.action.click()
    assert "Stop the answer first" in w.notice_banner.text()
    assert not [p for p in data_dir.iterdir() if ".unreadable-" in p.name]
    answering.set()
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=60_000)
    w.notice_banner.action.click()
    assert [r.title for r in w.store.conversations()] == ["a question"]
