"""Versions of messages in the real window, on the demo checkpoint: regenerate (any answer) and
edit keep the old version, "< 2/3 >" switches by mouse, Tab + Space or Alt+Left/Right, the
engine session reuses the prefix the branches share, a switch while an answer streams stops it
and keeps it, and a deleted chat takes every branch with it."""

from gui_helpers import data_dir, make_window, send, wait_idle  # noqa: F401 (fixtures)
from PySide6.QtCore import Qt

GREEDY = dict(use_model_sampling=False, temperature=0.0)


def rows(w):
    return w.store.messages(w.controller.current_id)


def press(qtbot, button):
    """The keyboard way: focus the button (it takes Tab focus), press Space."""
    qtbot.waitUntil(button.isVisible, timeout=5000)  # a new message is shown by the loop
    assert button.isEnabled()
    assert button.focusPolicy() & Qt.TabFocus
    button.setFocus(Qt.TabFocusReason)
    qtbot.keyClick(button, Qt.Key_Space)


def alt(qtbot, widget, key) -> None:
    """Alt+Left / Alt+Right where the keyboard focus is (the window's version shortcuts)."""
    qtbot.keyClick(widget, key, Qt.AltModifier)


def test_regenerate_twice_switch_to_the_first_and_ask_on_reusing_the_prefix(qtbot, make_window):
    w = make_window(**GREEDY)
    send(qtbot, w, "Here is a long description of a lake. " * 8 + "What is in it?")
    first = rows(w)[-1]
    assert first.stats["reused_tokens"] == 0 and first.versions == 1
    assert not w.chat.messages()[-1].versions.isVisibleTo(w)  # one version: no switch
    for _ in range(2):
        qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
        wait_idle(qtbot, w)
    last = w.chat.messages()[-1]
    assert last.versions.text == "3/3" and last.versions.isVisibleTo(w)
    assert not last.versions.next_button.isEnabled()
    assert last.versions.prev_button.toolTip() == "Previous version"
    assert last.versions.label.toolTip() == "Version 3 of 3"
    ids = w.store.versions(first.id)
    assert len(ids) == 3 and ids[0] == first.id
    # back to 1/3 with the keyboard
    press(qtbot, last.versions.prev_button)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].versions.text == "2/3", timeout=5000)
    press(qtbot, w.chat.messages()[-1].versions.prev_button)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].versions.text == "1/3", timeout=5000)
    shown = w.chat.messages()[-1]
    assert shown.message_id == first.id and shown.text == first.text
    assert [r.id for r in rows(w)] == [m.message_id for m in w.chat.messages()]
    # the next question follows the first answer; the session keeps the shared prefix
    send(qtbot, w, "And what colour is it?")
    path = rows(w)
    assert [r.id for r in path[:2]] == [path[0].id, first.id] and len(path) == 4
    assert w.stats.reused_tokens >= first.stats["prompt_tokens"]  # the prefill event's count
    assert path[-1].stats["reused_tokens"] == w.stats.reused_tokens
    assert 0 < path[-1].stats["prompt_tokens"] < w.stats.reused_tokens
    # the choice is stored: a restarted window shows the same branch and its versions
    cid = w.controller.current_id
    w.close()
    w2 = make_window(saved=True)
    assert w2.controller.current_id == cid
    assert [m.message_id for m in w2.chat.messages()] == [r.id for r in path]
    assert w2.chat.messages()[1].versions.text == "1/3"


def test_regenerating_an_earlier_answer_branches_there_and_keeps_the_later_turns(
    qtbot, make_window
):
    w = make_window(**GREEDY)
    for q in ("first question", "second question", "third question"):
        send(qtbot, w, q)
    old = [(r.id, r.role, r.text) for r in rows(w)]
    shown = w.chat.messages()
    assert [m.regenerate_button.isVisibleTo(w) for m in shown] == [False, True] * 3
    qtbot.mouseClick(shown[1].regenerate_button, Qt.LeftButton)  # the first of three answers
    assert w.controller.busy and len(w.chat.messages()) == 2
    wait_idle(qtbot, w)
    path = rows(w)
    assert [r.id for r in path][:1] == [old[0][0]] and len(path) == 2
    new = path[1]
    assert new.role == "assistant" and new.state == "done" and new.id not in {o[0] for o in old}
    assert w.store.versions(new.id) == [old[1][0], new.id]
    assert [m.message_id for m in w.chat.messages()] == [r.id for r in path]
    assert w.chat.messages()[-1].versions.text == "2/2"
    # the session held all three turns: the first question's rows were reused
    assert new.stats["reused_tokens"] > 0
    assert new.stats["prompt_tokens"] < new.stats["reused_tokens"]
    assert w.store.message_count(w.controller.current_id) == 7
    # the tree is stored: a restarted window shows the new version, the old branch is a switch away
    cid = w.controller.current_id
    w.close()
    w2 = make_window(saved=True)
    assert w2.controller.current_id == cid
    assert [m.message_id for m in w2.chat.messages()] == [r.id for r in path]
    assert w2.chat.messages()[-1].versions.text == "2/2"
    qtbot.mouseClick(w2.chat.messages()[-1].versions.prev_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: len(w2.chat.messages()) == 6, timeout=5000)
    assert [(m.message_id, m.role, m.text) for m in w2.chat.messages()] == old
    assert w2.chat.messages()[1].versions.text == "1/2"
    assert [(r.id, r.role, r.text) for r in rows(w2)] == old


def test_an_edit_keeps_the_old_tail_and_a_deleted_chat_takes_every_branch(qtbot, make_window):
    w = make_window()
    for q in ("first question", "second question", "third question"):
        send(qtbot, w, q)
    old = [(r.id, r.text) for r in rows(w)]
    w.controller.begin_edit(old[2][0])
    w.composer.set_text("second question, edited")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    wait_idle(qtbot, w)
    assert [r.text for r in rows(w)][:3] == ["first question", old[1][1], "second question, edited"]
    assert len(rows(w)) == 4
    edited = w.chat.messages()[2]
    assert edited.versions.text == "2/2"
    qtbot.mouseClick(edited.versions.prev_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: len(w.chat.messages()) == 6, timeout=5000)
    assert [(m.message_id, m.text) for m in w.chat.messages()] == old
    assert w.chat.messages()[2].versions.text == "1/2"
    cid = w.controller.current_id
    assert w.store.message_count(cid) == 8
    w.controller.delete_conversation(cid)
    assert w.store.message_count(cid) == 0 and w.store.conversation(cid) is None
    assert w.chat.messages() == []


def test_a_switch_while_an_answer_streams_stops_it_and_keeps_the_partial_answer(qtbot, make_window):
    w = make_window(max_new_tokens=400)
    send(qtbot, w, "Tell me about the shapes")
    first = rows(w)[-1]
    qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
    streaming = w.chat.messages()[-1]
    assert streaming.versions.text == "2/2"
    qtbot.waitUntil(lambda: bool(w.controller.answer and w.controller.answer.text), timeout=60_000)
    assert w.controller.busy
    qtbot.mouseClick(streaming.versions.prev_button, Qt.LeftButton)  # while it streams
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].message_id == first.id, timeout=5000)
    assert w.chat.messages()[-1].versions.text == "1/2"
    assert w.chat.messages()[-1].text == first.text
    partial_id = w.store.versions(first.id)[1]
    w.store.select_version(partial_id)
    partial = rows(w)[-1]
    w.store.select_version(first.id)
    assert partial.id == partial_id and partial.state == "stopped" and partial.text
    # and it is one click away in the window
    qtbot.mouseClick(w.chat.messages()[-1].versions.next_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].message_id == partial_id, timeout=5000)
    assert w.chat.messages()[-1].text == partial.text


def test_alt_left_and_right_switch_the_focused_or_else_the_last_message_with_versions(
    qtbot, make_window
):
    w = make_window()
    assert ("Alt+Left", "Previous version of a message") in w.shortcut_rows()  # Help lists them
    assert ("Alt+Right", "Next version of a message") in w.shortcut_rows()
    send(qtbot, w, "first question")
    qtbot.mouseClick(w.chat.messages()[1].regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    send(qtbot, w, "second question")
    qtbot.mouseClick(w.chat.messages()[3].regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    path = [m.message_id for m in w.chat.messages()]
    versions = lambda: [m.versions.text for m in w.chat.messages()]  # noqa: E731
    assert versions() == ["", "2/2", "", "2/2"]
    # typing in the composer: the last message with versions switches
    edit = w.composer.edit
    edit.setFocus()
    qtbot.waitUntil(edit.hasFocus, timeout=5000)
    alt(qtbot, edit, Qt.Key_Left)
    qtbot.waitUntil(lambda: versions() == ["", "2/2", "", "1/2"], timeout=5000)
    assert [m.message_id for m in w.chat.messages()][:3] == path[:3]
    assert edit.toPlainText() == ""  # the composer took no key
    alt(qtbot, edit, Qt.Key_Right)
    qtbot.waitUntil(lambda: versions() == ["", "2/2", "", "2/2"], timeout=5000)
    assert [m.message_id for m in w.chat.messages()] == path
    alt(qtbot, edit, Qt.Key_Right)  # past the newest: nothing happens
    assert [m.message_id for m in w.chat.messages()] == path
    # the focus in a message (its text, clicked to select): that message switches
    body = w.chat.messages()[1].body
    body.setFocus()
    qtbot.waitUntil(body.hasFocus, timeout=5000)
    alt(qtbot, body, Qt.Key_Left)
    qtbot.waitUntil(lambda: versions() == ["", "1/2"], timeout=5000)  # its branch: no later turns
    assert w.store.versions(path[1])[1] == path[1]
    assert [r.id for r in rows(w)] == [m.message_id for m in w.chat.messages()]


def test_alt_left_while_an_answer_streams_stops_it_and_keeps_it(qtbot, make_window):
    w = make_window(max_new_tokens=400)
    send(qtbot, w, "Tell me about the shapes")
    first = rows(w)[-1]
    qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: bool(w.controller.answer and w.controller.answer.text), timeout=60_000)
    streaming_id = w.controller.answer.message_id
    alt(qtbot, w.composer.edit, Qt.Key_Left)  # while it streams
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].message_id == first.id, timeout=5000)
    assert w.chat.messages()[-1].versions.text == "1/2"
    assert w.chat.messages()[-1].text == first.text
    alt(qtbot, w.composer.edit, Qt.Key_Right)  # the stopped answer, as far as it got
    qtbot.waitUntil(lambda: w.chat.messages()[-1].message_id == streaming_id, timeout=5000)
    partial = rows(w)[-1]
    assert partial.id == streaming_id and partial.state == "stopped" and partial.text
    assert w.chat.messages()[-1].text == partial.text
    assert w.chat.messages()[-1].versions.text == "2/2"


def test_the_switch_follows_a_language_change(qtbot, make_window):
    w = make_window()
    send(qtbot, w, "Hello")
    qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    new = type(w.settings)(**vars(w.settings))
    new.language = "zh_CN"
    w.apply_settings(new)
    switch = w.chat.messages()[-1].versions
    qtbot.waitUntil(lambda: switch.prev_button.toolTip() == "上一个版本", timeout=5000)
    assert switch.next_button.toolTip() == "下一个版本"
    assert switch.label.toolTip() == "第 2 个版本，共 2 个"


def test_a_schema_1_history_made_by_the_old_code_opens_and_branches(qtbot, make_window, data_dir):
    import shutil
    import sqlite3
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "chats_v1"
    shutil.copytree(fixture, data_dir)
    db = sqlite3.connect(data_dir / "chats.sqlite3")
    old = db.execute(
        "SELECT id, role, text FROM messages WHERE conversation_id = 1 ORDER BY id"
    ).fetchall()
    db.close()
    w = make_window()
    assert w.store.schema_version >= 2
    titles = [c.title for c in w.store.conversations()]
    assert sorted(titles) == sorted(["Boats on the lake", "红色的圆", "Left streaming"])
    w.controller.open_conversation(1)
    shown = [(m.message_id, m.role, m.text) for m in w.chat.messages()]
    assert shown == [tuple(r) for r in old]
    assert w.chat.messages()[0].image_paths  # the v1 image is still there
    qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    assert w.chat.messages()[-1].versions.text == "2/2"
    qtbot.mouseClick(w.chat.messages()[-1].versions.prev_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].message_id == old[-1][0], timeout=5000)
    assert [(m.message_id, m.role, m.text) for m in w.chat.messages()] == shown


def test_a_saved_session_of_another_branch_gives_the_shared_prefix_and_a_right_answer(
    qtbot, make_window, data_dir
):
    """The session saved on disk holds the newest answer's branch; the chat is reopened on an
    older version: the next turn reuses only what the two branches share, and answers as a
    recompute from scratch does."""
    from test_sessions import recomputed_last_answer, reopen, wait_saved

    w = make_window(**GREEDY)
    send(qtbot, w, "Describe a lake in the mountains. " * 4)
    first = rows(w)[-1]
    saved = wait_saved(qtbot, w)
    w.settings.use_model_sampling, w.settings.temperature = True, 1.0  # another answer
    qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    saved = wait_saved(qtbot, w, saved)  # the file now holds version 2
    w.settings.use_model_sampling, w.settings.temperature = False, 0.0
    qtbot.mouseClick(w.chat.messages()[-1].versions.prev_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: w.chat.messages()[-1].message_id == first.id, timeout=5000)
    cid = w.controller.current_id
    assert reopen(qtbot, w, cid).restored
    send(qtbot, w, "Which animals live there?")
    answer = rows(w)[-1]
    assert [r.id for r in rows(w)][:2] == [rows(w)[0].id, first.id]
    assert answer.stats["reused_tokens"] >= first.stats["prompt_tokens"]
    assert 0 < answer.stats["prompt_tokens"]
    wait_saved(qtbot, w, saved)
    assert recomputed_last_answer(qtbot, w, cid, data_dir) == answer.text


def test_a_rewrite_left_unsent_comes_back_with_the_draft(qtbot, make_window, tmp_path):
    """Opening another chat, a new one, or switching the edited message's version ends an
    edit neither sent nor cancelled: the put-aside draft comes back with the rewrite after it
    (the rewrite had been dropped without a word; Esc still drops it)."""
    w = make_window()
    send(qtbot, w, "first chat")
    first = w.controller.current_id
    w.new_chat()
    send(qtbot, w, "a question")
    second = w.controller.current_id
    question = rows(w)[0]
    for way in ("another chat", "a new chat", "a version switch"):
        w.controller.open_conversation(second)
        qtbot.waitUntil(lambda: len(w.chat.messages()) >= 2, timeout=5000)
        w.composer.set_text("half-written next question")
        w.controller.begin_edit(question.id)
        w.composer.set_text("a question, rewritten at length")
        if way == "another chat":
            w.controller.open_conversation(first)
        elif way == "a new chat":
            w.new_chat()
        else:  # < (Alt+Left)
            w.chat.sig_version_requested.emit(question.id, -1)
        qtbot.waitUntil(lambda: not w.composer.editing, timeout=5000)
        assert w.composer.text() == "half-written next question\n\na question, rewritten at length"
        if way == "a new chat":  # a version switch needs versions: make one for the next round
            w.controller.open_conversation(second)
            qtbot.waitUntil(lambda: len(w.chat.messages()) >= 2, timeout=5000)
            w.composer.set_text("")
            w.controller.begin_edit(question.id)
            w.composer.set_text("a question, sent as a version")
            qtbot.keyClick(w.composer.edit, Qt.Key_Return)
            wait_idle(qtbot, w)
            question = rows(w)[0]
    w.composer.set_text("the draft")
    w.controller.begin_edit(rows(w)[0].id)
    assert w.composer.editing
    w.composer.set_text("a rewrite given up")
    w.composer.cancel_edit()
    assert w.composer.text() == "the draft"
