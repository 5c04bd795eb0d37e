"""Export, import and copy through the real window's Chat menu (offscreen, demo checkpoint),
a thinking answer's reasoning in them (never in the copied answer), and the shortcut list in
Help covering every action that has a shortcut."""

import json

from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)
from PySide6.QtWidgets import QApplication
from test_thinking_app import _fake_engine, _feed, _tokens

from merlin.app.widgets import chat_files
from merlin.engine.generate import Finished


def test_export_import_and_copy_a_chat(qtbot, make_window, tmp_path):
    w = make_window()
    send(qtbot, w, "What is in the picture?")
    cid = w.controller.current_id
    answer = w.store.messages(cid)[-1].text

    out = chat_files.export_chat(w, str(tmp_path / "chat.json"))
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["conversations"][0]["messages"][-1]["text"] == answer
    md = chat_files.export_chat(w, str(tmp_path / "chat.md"))
    assert "What is in the picture?" in md.read_text(encoding="utf-8")
    assert "What is in the picture?" in chat_files.copy_markdown(w)
    assert "What is in the picture?" in QApplication.clipboard().text()

    before = len(w.store.conversations())
    ids = chat_files.import_chats(w, str(out))
    assert len(ids) == 1 and len(w.store.conversations()) == before + 1
    assert w.store.messages(ids[0])[-1].text == answer
    assert w.conversations.list.count() == before + 1
    assert w.notice_banner.isVisible() and "Imported 1" in w.notice_banner.label.text()

    every = chat_files.export_all(w, str(tmp_path / "all.json"))
    assert len(json.loads(every.read_text(encoding="utf-8"))["conversations"]) == before + 1


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
    copied = chat_files.copy_markdown(w)  # Copy chat as Markdown: the reasoning folded
    assert QApplication.clipboard().text() == copied
    block = "<details>\n<summary>Thinking</summary>\n\n> Light \\<b>scatters\\</b>; \\</details>"
    assert block in copied
    assert copied.index("</details>\n\nRayleigh scattering.") > copied.index(block)
    md = chat_files.export_chat(w, str(tmp_path / "sky.md"))
    assert md.read_text(encoding="utf-8") == copied
    # JSON: out and back in, the imported chat shows the reasoning apart from its answer
    out = chat_files.export_chat(w, str(tmp_path / "sky.json"))
    assert json.loads(out.read_text("utf-8"))["conversations"][0]["messages"][1]["reasoning"] == (
        reasoning
    )
    (new,) = chat_files.import_chats(w, str(out))
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
    assert chat_files.import_chats(w, str(bad)) == []
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
        assert chat_files.import_chats(w, str(tmp_path / name)) == [], name
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
        out = action(w, str(tmp_path / typed))  # free: written under the added name
        assert out == tmp_path / existing and out.stat().st_size > 0
    replaced = tmp_path / "asked.json"  # typed with its suffix: the dialog asked
    replaced.write_text("old")
    assert chat_files.export_all(w, str(replaced)) == replaced and replaced.read_text() != "old"


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
