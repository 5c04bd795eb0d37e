"""Conversations continue from the engine's session: the KV prefix is reused across turns,
saved when a turn ends, restored when the chat is opened again (also by a new window on the
same data folder), ignored when damaged; context notices show in the chat; the disk limit is
a persisted setting."""

from gui_helpers import data_dir, drafts_on_disk, make_window, send, wait_idle  # noqa: F401 (fixtures)
from PySide6.QtCore import Qt

from merlin.app.settings import SettingsDialog, load_settings

GREEDY = dict(use_model_sampling=False, temperature=0.0)


def answers(window):
    rows = window.store.messages(window.controller.current_id)
    return [r for r in rows if r.role == "assistant"]


def session_file(data_dir, cid):
    return data_dir / "sessions" / f"{cid}.msession"


def wait_saved(qtbot, window, before=None):
    """Until the worker reports a save newer than `before` (the save follows Finished)."""
    c = window.controller
    qtbot.waitUntil(lambda: c.last_save is not None and c.last_save is not before, timeout=30_000)
    assert c.last_save.action == "saved", c.last_save.reason
    return c.last_save


def reopen(qtbot, window, cid):
    """Show another chat (the worker drops the session), then `cid` again; returns the
    worker's restore report for it."""
    c = window.controller
    c.open_conversation(None)
    c.last_restore = None
    c.open_conversation(cid)
    qtbot.waitUntil(lambda: c.last_restore is not None, timeout=30_000)
    assert c.last_restore.conversation_id == cid
    return c.last_restore


def recomputed_last_answer(qtbot, window, cid, data_dir) -> str:
    """The last answer again, from the SQLite history only (no saved session, nothing
    cached): the reference a restored session must match."""
    session_file(data_dir, cid).unlink()
    report = reopen(qtbot, window, cid)
    assert not report.restored and report.reason == "no saved session"
    last = window.chat.messages()[-1]
    qtbot.mouseClick(last.regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, window)
    answer = answers(window)[-1]
    assert answer.state == "done"
    assert answer.stats["reused_tokens"] == 0  # really recomputed
    return answer.text


def test_follow_up_regenerate_and_edit_reuse_the_cached_prefix(qtbot, make_window):
    w = make_window(**GREEDY)
    # a long first question: what the second turn must not compute again
    send(qtbot, w, "Here is a long description of a lake. " * 12 + "What is in it?")
    first = answers(w)[-1].stats
    assert first["reused_tokens"] == 0 and first["prompt_tokens"] > 0
    send(qtbot, w, "And what colour is it?")
    second = answers(w)[-1].stats
    # only the new turn is prefilled: far fewer rows than the cache already held
    assert second["reused_tokens"] >= first["prompt_tokens"]
    assert 0 < second["prompt_tokens"] < second["reused_tokens"]
    assert w.stats.reused_tokens == second["reused_tokens"]
    assert w.stats.prefill_tokens == second["prompt_tokens"]
    w.panel.refresh(force=True)
    shown = w.panel.values["prefill"].text().replace("\u00a0", " ")  # no-break spaces
    assert f"reused {second['reused_tokens']}" in shown
    assert f"computed {second['prompt_tokens']}" in shown
    # regenerate: the whole question is cached, only its last row is fed again
    qtbot.mouseClick(w.chat.messages()[-1].regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    again = answers(w)[-1].stats
    assert again["prompt_tokens"] == 1 and again["reused_tokens"] > second["reused_tokens"]
    # edit the second question: the first turn stays cached
    user_ids = [m.message_id for m in w.chat.messages() if m.role == "user"]
    w.controller.ask = lambda title, text: True
    w.controller.begin_edit(user_ids[1])
    w.composer.set_text("And its shape?")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    wait_idle(qtbot, w)
    edited = answers(w)[-1].stats
    assert edited["reused_tokens"] >= first["prompt_tokens"]
    assert edited["prompt_tokens"] < edited["reused_tokens"]


def test_reopened_chat_restores_its_session_and_answers_as_a_recompute(
    qtbot, make_window, data_dir
):
    w1 = make_window(**GREEDY)
    send(qtbot, w1, "Describe a lake in the mountains.")
    cid = w1.controller.current_id
    question_tokens = answers(w1)[-1].stats["prompt_tokens"]
    saved = wait_saved(qtbot, w1)
    assert saved.conversation_id == cid and saved.tokens > question_tokens
    assert session_file(data_dir, cid).stat().st_size == saved.file_bytes
    w1.close()

    # the app restarts on the same data folder and the user continues the chat
    w2 = make_window(**GREEDY, last_conversation=cid)
    c = w2.controller
    assert c.current_id == cid
    qtbot.waitUntil(lambda: c.last_restore is not None, timeout=30_000)
    assert c.last_restore.restored, c.last_restore.reason
    assert c.last_restore.tokens == saved.tokens
    send(qtbot, w2, "Which animals live there?")
    answer = answers(w2)[-1]
    assert answer.state == "done" and answer.text
    # the first turn came from the file, not computed again: the question and the answer
    # (as the ids it was generated as, whatever their tokenization)
    assert answer.stats["reused_tokens"] == saved.tokens > question_tokens
    wait_saved(qtbot, w2, saved)
    assert recomputed_last_answer(qtbot, w2, cid, data_dir) == answer.text


def test_a_stopped_answer_is_saved_and_continued_from(qtbot, make_window, data_dir):
    w = make_window(max_new_tokens=100_000, **GREEDY)
    send(qtbot, w, "Tell me a very long story.", wait=False)
    streaming = w.chat.messages()[-1]
    qtbot.waitUntil(lambda: len(streaming.text) > 20, timeout=60_000)
    w.controller.stop()
    wait_idle(qtbot, w)
    stopped = answers(w)[-1]
    assert stopped.state == "stopped"
    saved = wait_saved(qtbot, w)
    assert session_file(data_dir, w.controller.current_id).is_file()
    assert saved.tokens > stopped.stats["prompt_tokens"]  # the partial answer is in it
    w.settings.max_new_tokens = 8
    send(qtbot, w, "Go on.")
    assert answers(w)[-1].stats["reused_tokens"] >= stopped.stats["prompt_tokens"]


def test_an_image_is_encoded_once_also_after_a_restart(qtbot, make_window, tmp_path):
    from merlin.app.modes.demo_image import draw_demo_image

    w1 = make_window(**GREEDY)
    w1.composer.add_paths([str(draw_demo_image(tmp_path / "lake.png"))])
    w1.composer.wait_attachments()
    send(qtbot, w1, "What is in the picture?")
    first = answers(w1)[-1].stats
    on_attach = any(st.state == "done" for st in w1.controller.images.last.values())
    assert first["vision_ms"] > 0 or on_attach  # encoded now (for the answer or on attach)
    send(qtbot, w1, "And the sky?")
    follow = answers(w1)[-1].stats
    assert follow["vision_ms"] == 0 and follow["reused_tokens"] >= first["prompt_tokens"]
    cid = w1.controller.current_id
    wait_saved(qtbot, w1)
    w1.close()
    w2 = make_window(**GREEDY, last_conversation=cid)
    qtbot.waitUntil(lambda: w2.controller.last_restore is not None, timeout=30_000)
    assert w2.controller.last_restore.restored
    send(qtbot, w2, "Any boats?")
    after = answers(w2)[-1].stats
    assert after["vision_ms"] == 0  # the embedding came from the saved session
    assert after["reused_tokens"] >= first["prompt_tokens"]


def test_damaged_session_file_is_ignored_and_the_chat_recomputed(qtbot, make_window, data_dir):
    w1 = make_window(**GREEDY)
    send(qtbot, w1, "Describe a lake in the mountains.")
    cid = w1.controller.current_id
    wait_saved(qtbot, w1)
    w1.close()
    path = session_file(data_dir, cid)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xa5" * 64  # flipped bytes in the KV rows
    path.write_bytes(bytes(data))

    w2 = make_window(**GREEDY)
    report = reopen(qtbot, w2, cid)
    assert not report.restored and report.reason and report.reason != "no saved session"
    send(qtbot, w2, "Which animals live there?")
    answer = answers(w2)[-1]
    assert answer.state == "done" and answer.text
    assert answer.stats["reused_tokens"] == 0
    saved = wait_saved(qtbot, w2)  # the damaged file is replaced by a good one
    assert reopen(qtbot, w2, cid).restored
    assert saved.tokens > 0
    assert recomputed_last_answer(qtbot, w2, cid, data_dir) == answer.text


def test_trim_notice_is_shown_in_the_chat_and_kept(qtbot, make_window):
    w = make_window(context_budget=100, max_new_tokens=12, **GREEDY)
    noticed = None
    for i in range(8):
        send(qtbot, w, f"Question {i}: tell me about the lake and the mountains behind it.")
        assert answers(w)[-1].state == "done"
        last = w.chat.messages()[-1]
        if last.notices.isVisibleTo(w):
            noticed = last
            break
    assert noticed is not None, "the conversation never outgrew the 100-token budget"
    assert "left out" in noticed.notices.text()
    assert "left out" in answers(w)[-1].stats["notices"][0]
    # every message stays in the chat and in the store
    assert len(w.store.messages(w.controller.current_id)) == 2 * (i + 1)
    cid = w.controller.current_id
    w.controller.open_conversation(None)
    w.controller.open_conversation(cid)
    assert "left out" in w.chat.messages()[-1].notices.text()
    earlier = [m for m in w.chat.messages()[:-1] if m.role == "assistant"]
    assert not any(m.notices.isVisibleTo(w) for m in earlier)


def test_finished_notices_are_shown_on_the_answer(qtbot, make_window):
    from merlin.engine.speculative import MAX_K

    w = make_window(spec_mode="on", spec_k=MAX_K + 4)  # e.g. a hand-edited settings.ini
    send(qtbot, w, "Hello")
    answer = answers(w)[-1]
    assert answer.state == "done" and answer.text  # the answer is given anyway
    shown = w.chat.messages()[-1].notices
    assert shown.isVisibleTo(w) and "Speculative decoding is off" in shown.text()
    assert "Speculative decoding is off" in answer.stats["notices"][0]


def test_session_disk_limit_is_a_persisted_setting(qtbot, make_window, data_dir):
    w = make_window(**GREEDY)
    send(qtbot, w, "Hello")
    cid = w.controller.current_id
    saved = wait_saved(qtbot, w)
    path = session_file(data_dir, cid)
    assert path.is_file()
    dialog = SettingsDialog(w.settings, w)
    assert "1 file" in dialog.session_usage.text()
    dialog.session_cap.setValue(0)  # keep no saved sessions
    w.apply_settings(dialog.result_settings())
    assert load_settings().session_cap_mb == 0
    qtbot.waitUntil(lambda: not path.exists(), timeout=10_000)  # evicted at once
    send(qtbot, w, "Again")
    assert answers(w)[-1].state == "done"
    qtbot.wait(200)  # nothing to wait for: the worker must not save at all
    assert not path.exists() and w.controller.last_save is saved
    dialog = SettingsDialog(w.settings, w)
    assert dialog.session_cap.value() == 0 and "0 file" in dialog.session_usage.text()
    dialog.session_cap.setValue(512)
    w.apply_settings(dialog.result_settings())
    assert load_settings().session_cap_mb == 512
    send(qtbot, w, "And now?")
    wait_saved(qtbot, w, saved)
    assert path.is_file()


def test_a_session_that_cannot_be_saved_is_reported_and_the_chat_goes_on(
    qtbot, make_window, data_dir
):
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "sessions").write_text("not a folder")  # like a full or read-only disk
    w = make_window(**GREEDY)
    send(qtbot, w, "Hello")
    c = w.controller
    qtbot.waitUntil(lambda: c.last_save is not None, timeout=30_000)
    assert c.last_save.action == "not_saved" and "not saved" in c.last_save.reason
    assert w.notice_banner.isVisibleTo(w)
    assert "was not saved for quick continuation" in w.notice_banner.text()
    send(qtbot, w, "And again")  # the session in memory still serves the next turn
    answer = answers(w)[-1]
    assert answer.state == "done" and answer.stats["reused_tokens"] > 0


def test_deleting_a_chat_deletes_its_saved_session(qtbot, make_window, data_dir):
    w = make_window(**GREEDY)
    send(qtbot, w, "Hello")
    cid = w.controller.current_id
    wait_saved(qtbot, w)
    path = session_file(data_dir, cid)
    assert path.is_file()
    w.controller.delete_conversation(cid)
    qtbot.waitUntil(lambda: not path.exists(), timeout=10_000)
    assert w.store.conversation(cid) is None


def test_too_long_message_is_refused_inline_and_kept(qtbot, make_window):
    from merlin.engine.prompt import MAX_MESSAGE_CHARS

    w = make_window()
    text = "x" * (MAX_MESSAGE_CHARS + 1)
    send(qtbot, w, text, wait=False)
    assert not w.controller.busy and w.controller.current_id is None
    assert w.composer.text() == text
    assert w.composer.notice.isVisibleTo(w)
    assert "cannot be sent" in w.composer.notice.text()
    assert f"{MAX_MESSAGE_CHARS:,}" in w.composer.notice.text()


def test_model_too_big_for_memory_is_a_clear_message(qtbot, make_window, monkeypatch):
    from merlin.engine import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 1024 * 1024)
    w = make_window()
    assert w.controller.model is None
    text = w.model_banner.text()
    assert "Could not load the model: not enough memory" in text
    assert "memory is available" in text


def tinted_text(message) -> str:
    """The text of the answer drawn on the drafted-token background."""
    from merlin.app.widgets import theme

    tint = theme.drafted_background()
    doc, out = message.body.document(), []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and frag.charFormat().background().color() == tint:
                out.append(frag.text())
            it += 1
        block = block.next()
    return "".join(out)


def test_text_from_accepted_drafts_is_tinted(qtbot, make_window):
    w = make_window(spec_mode="on", max_new_tokens=120, **GREEDY)
    # A random-weight model's greedy text falls into loops, which the drafter then predicts;
    # which prompt loops first depends on the kernels' rounding, so try a few.
    for prompt in ("Tell me a very long story.", "Describe a river.", "Count to one hundred."):
        send(qtbot, w, prompt)
        answer = answers(w)[-1]
        spans = answer.stats.get("drafted")
        if spans:
            break
    assert spans, "none of the demo's greedy answers had an accepted draft"
    assert all(0 <= s < e <= len(answer.text) for s, e in spans)
    tinted = tinted_text(w.chat.messages()[-1])
    # exactly those pieces, up to whitespace (a line break is a block boundary, not a character,
    # in the rendered document)
    drafted = "".join(answer.text[s:e] for s, e in spans)
    assert "".join(tinted.split()) == "".join(drafted.split())
    cid = w.controller.current_id
    w.controller.open_conversation(None)
    w.controller.open_conversation(cid)
    assert tinted_text(w.chat.messages()[-1]) == tinted  # kept with the message
    w.settings.spec_mode = "off"
    send(qtbot, w, "Again, please.")
    assert "drafted" not in answers(w)[-1].stats
    assert tinted_text(w.chat.messages()[-1]) == ""


def test_a_follow_up_after_a_long_answer_recomputes_only_the_new_turn(qtbot, make_window):
    """The answer's KV rows are reused whatever tokenization the model chose for it (the
    session keeps the ids it generated; the random demo model's are rarely canonical)."""
    w = make_window(max_new_tokens=60, **GREEDY)
    send(qtbot, w, "Tell me a long story about a lighthouse.")
    first = answers(w)[-1].stats
    assert first["reused_tokens"] == 0 and first["tokens"] == 60
    held = first["prompt_tokens"] + first["tokens"] - 1  # the last token is never fed
    send(qtbot, w, "And then?")
    second = answers(w)[-1].stats
    assert second["reused_tokens"] == held, (second, held)
    assert second["prompt_tokens"] < 20  # the new turn only


def test_unsent_text_survives_closing_and_a_crash(qtbot, make_window, data_dir):  # noqa: F811
    """What is typed and not sent is on disk a second after typing stops and at close; the
    next window puts it back. A sent message leaves no draft; an edit keeps the text that
    was put aside for it."""
    from merlin.app.model.paths import data_dir as folder

    w1 = make_window()
    w1.composer.set_text("a long question I have not finished")
    qtbot.waitUntil(lambda: drafts_on_disk(folder()).text.startswith("a long"), timeout=5000)
    # as after a crash: the next start finds it without the first window closing (its
    # process gone, its draft's lock is free)
    w1._drafts._lock.close()
    w2 = make_window()
    assert w2.composer.text() == "a long question I have not finished"
    w2.composer.set_text("")
    send(qtbot, w2, "sent now")
    w2.save_draft()
    assert drafts_on_disk(folder()).empty and not list(folder().glob("drafts/*.json"))
    w2.composer.set_text("put aside")
    w2.controller.begin_edit(w2.store.messages(w2.controller.current_id)[0].id)
    w2.save_draft()
    assert drafts_on_disk(folder()).text == "put aside"  # the edit, unchanged, is no writing
    w2.composer.set_text("sent now, rewritten")
    picture = folder().parent / "added.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (10, 200, 10)).save(picture)
    w2.composer.add_paths([str(picture)])  # a picture added to the edit
    w2.composer.wait_attachments()
    w2.close()  # mid-edit: the rewrite and the picture are kept after the draft (were lost)
    kept = drafts_on_disk(folder())
    assert kept.text == "put aside\n\nsent now, rewritten"
    assert [i.name for i in kept.images] == ["added.png"]


def test_unsent_pictures_and_their_detail_survive_a_restart(
    qtbot,
    make_window,
    data_dir,
    tmp_path,  # noqa: F811
):
    """Pictures attached to an unsent message come back at the next start, in their order
    and with the detail chosen, from the store's copies: the original files may be gone and
    the store's collection at opening (the copies older than its grace period) spares them.
    Once sent, the draft is gone and nothing is pinned."""
    import os
    import time

    from PIL import Image

    from merlin.app.model import draft
    from merlin.app.model.paths import data_dir as folder
    from merlin.app.model.store import IMAGE_GRACE_S

    paths = []
    for name, color in (("first.png", (200, 30, 30)), ("second.png", (30, 30, 200))):
        Image.new("RGB", (64, 48), color).save(tmp_path / name)
        paths.append(str(tmp_path / name))
    w1 = make_window()
    w1.composer.set_text("compare these")
    w1.composer.add_paths(paths)
    w1.composer.wait_attachments()
    second = w1.composer.attachments()[1]
    w1.composer.chip(second).choose_detail("fast")
    qtbot.waitUntil(
        lambda: [i.detail for i in drafts_on_disk(folder()).images] == ["", "fast"],
        timeout=5000,
    )
    w1.close()
    kept = drafts_on_disk(folder())
    assert [i.name for i in kept.images] == ["first.png", "second.png"]
    assert all(i.sha256 for i in kept.images)
    for p in paths:
        os.unlink(p)  # the originals are gone; the store's copies are what comes back
    old = time.time() - 2 * IMAGE_GRACE_S
    for i in kept.images:
        os.utime(folder() / "images" / i.file_name, (old, old))
    w2 = make_window()
    w2.composer.wait_attachments()
    back = w2.composer.attachments()
    assert w2.composer.text() == "compare these"
    assert [a.name for a in back] == ["first.png", "second.png"]
    assert [a.detail for a in back] == ["", "fast"]
    assert w2.composer.chip(back[1]).detail == "fast"
    assert all(a.stored is not None and a.stored.sha256 for a in back)
    send(qtbot, w2, "compare these")
    w2.save_draft()
    assert drafts_on_disk(folder()).empty
    assert draft.draft_image_files(folder()) == set()


def test_sending_an_edit_gives_back_the_message_put_aside(qtbot, make_window, tmp_path):
    """Editing an earlier message puts the message being written aside; sending the edit
    brings it back into the box, text and pictures (it was dropped: typed text lost)."""
    from PIL import Image

    Image.new("RGB", (32, 32), (10, 120, 60)).save(tmp_path / "leaf.png")
    w = make_window(max_new_tokens=4, **GREEDY)
    send(qtbot, w, "first question")
    w.composer.set_text("the next question, half written")
    w.composer.add_paths([str(tmp_path / "leaf.png")])
    w.composer.wait_attachments()
    w.controller.begin_edit(w.store.messages(w.controller.current_id)[0].id)
    assert w.composer.editing and w.composer.text() == "first question"
    send(qtbot, w, "first question, edited")
    assert not w.composer.editing
    assert w.composer.text() == "the next question, half written"
    assert [a.name for a in w.composer.attachments()] == ["leaf.png"]
    users = [m.text for m in w.store.messages(w.controller.current_id) if m.role == "user"]
    assert users == ["first question, edited"]


def test_an_earlier_picture_the_engine_refuses_is_left_out_with_a_notice(
    qtbot, make_window, tmp_path
):
    """A chat holding a truncated JPEG and a 1000x4 strip in an earlier message (attached by a
    Merlin that did not check pictures yet) failed at every later question. The worker
    leaves them out (the check decodes them: never on the GUI thread) and the answer says
    which, by the names they were attached as."""
    from PIL import Image

    w = make_window(**GREEDY)
    send(qtbot, w, "Hello")
    c, store = w.controller, w.store
    cid = c.current_id
    cut, strip = tmp_path / "cut.jpg", tmp_path / "strip.png"
    Image.radial_gradient("L").convert("RGB").save(cut, quality=95)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    Image.new("RGB", (1000, 4), (0, 0, 255)).save(strip)
    refs = [store.import_image(p) for p in (cut, strip)]
    last = store.messages(cid)[-1].id
    asked = store.add_message(cid, "user", "What about these?", refs, "done", last)
    store.add_message(cid, "assistant", "Nice.", (), "done", asked)
    c.open_conversation(None)
    c.open_conversation(cid)
    send(qtbot, w, "And now?")
    answer = answers(w)[-1]
    assert answer.state == "done", answer.text
    assert any("cut.jpg" in n and "strip.png" in n for n in answer.stats["notices"])


def test_a_draft_that_cannot_be_kept_is_said_and_asked_about_at_close(
    qtbot, make_window, monkeypatch
):
    """On a full disk the unsent text was lost at close with a line in the log only."""
    import errno

    from merlin.app.model import draft as draft_module

    def full(path, draft):
        raise OSError(errno.ENOSPC, "No space left on device")

    w = make_window()
    w.composer.set_text("an answer to keep")
    monkeypatch.setattr(draft_module, "write_draft_file", full)
    assert not w.save_draft()
    assert "could not be kept on disk (No space left on device)" in w.notice_banner.text()
    asked = []
    monkeypatch.setattr(w, "ask", lambda title, text: asked.append(text) or False)
    w.close()
    assert asked and "Close and lose it?" in asked[0]
    assert w.isVisible() and w.composer.text() == "an answer to keep"  # not closed
    w.composer.set_text("")  # nothing written: an old file left behind loses nothing
    monkeypatch.setattr(w, "ask", lambda title, text: asked.append(text) or False)
    w.close()
    assert not w.isVisible() and len(asked) == 1
