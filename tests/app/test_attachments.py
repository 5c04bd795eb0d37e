"""Images in: drop anywhere, paste, the attach list; bad input of every kind reported inline,
and nothing the user typed is lost."""

import warnings

import pytest
from gui_helpers import data_dir, drafts_on_disk, make_window, send, wait_idle  # noqa: F401 (fixtures)
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QApplication

from merlin.app.widgets.model_dialog import ModelChoice, ModelDialog, folder_problem


def png(path, w=96, h=64, color="#3A6EA5"):
    image = QImage(w, h, QImage.Format_RGB32)
    image.fill(QColor(color))
    assert image.save(str(path), "PNG")
    return path


def drop(window, target, *paths):
    """A drag-and-drop of local files onto `target` (a widget somewhere in the window): the
    events go to the target and travel up to the first widget that takes drops."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = target.rect().center()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        enter = QDragEnterEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(target, enter)
    assert enter.isAccepted()
    event = QDropEvent(QPointF(pos), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(target, event)
    assert event.isAccepted()


def stored(window):
    return window.store.messages(window.controller.current_id)


def gate_reads(monkeypatch, *names):
    """Make reading the files with these names wait until their event is set (a slow or hung
    file); other files are read at once. Returns the events by name."""
    import os
    import threading

    from merlin.app.widgets import composer

    gates = {name: threading.Event() for name in names}
    real = composer.read_image

    def read(path, name=None):
        gate = gates.get(os.path.basename(path))
        if gate is not None:
            assert gate.wait(60)
        return real(path, name)

    monkeypatch.setattr(composer, "read_image", read)
    return gates


def test_dropped_image_is_attached_sent_and_answered(qtbot, make_window, tmp_path):
    w = make_window()
    drop(w, w.chat.viewport(), png(tmp_path / "lake.png"))
    w.composer.wait_attachments()
    assert [a.name for a in w.composer.attachments()] == ["lake.png"]
    assert w.composer.chip_row.isVisibleTo(w)
    send(qtbot, w, "What is in the picture?")
    rows = stored(w)
    assert [i.name for i in rows[0].images] == ["lake.png"]
    assert rows[1].state == "done", rows[1].stats
    # the vision encoder ran: for the answer, or on attach (the rows computed while typing)
    on_attach = any(st.state == "done" for st in w.controller.images.last.values())
    assert w.stats.vision_ms > 0 or (on_attach and rows[1].stats["reused_tokens"] > 0)
    user = w.chat.messages()[0]
    assert user.thumb_row.isVisibleTo(w) and len(user.image_paths) == 1
    assert w.composer.attachments() == []  # sent: the attach list is empty again


def test_pasted_image_is_attached_and_removable(qtbot, make_window):
    w = make_window()
    image = QImage(80, 80, QImage.Format_RGB32)
    image.fill(QColor("#F58518"))
    QGuiApplication.clipboard().setImage(image)
    w.composer.edit.setFocus()
    w.composer.edit.paste()
    w.composer.wait_attachments()
    assert len(w.composer.attachments()) == 1
    QGuiApplication.clipboard().setImage(image)
    qtbot.keyClick(w.composer.edit, Qt.Key_V, Qt.ControlModifier)
    w.composer.wait_attachments()
    assert len(w.composer.attachments()) == 2
    chip = w.composer.chips.itemAt(0).widget()
    qtbot.mouseClick(chip.remove, Qt.LeftButton)
    assert len(w.composer.attachments()) == 1
    send(qtbot, w, "and this one?")
    assert len(stored(w)[0].images) == 1 and stored(w)[1].state == "done"


def test_bad_files_get_a_message_and_the_text_stays(qtbot, make_window, tmp_path):
    w = make_window()
    w.composer.set_text("my question, typed before the drop")
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    drop(w, w.chat.viewport(), notes)
    w.composer.wait_attachments()
    assert w.composer.attachments() == []
    assert "not an image" in w.composer.notice.text()
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 50)
    drop(w, w.composer.edit, broken)
    w.composer.wait_attachments()
    assert w.composer.attachments() == []
    assert "broken.png" in w.composer.notice.text()
    assert "corrupt" in w.composer.notice.text()  # the engine's reason (check_image_file)
    drop(w, w.chat.viewport(), tmp_path)  # a folder
    w.composer.wait_attachments()
    assert "folder" in w.composer.notice.text()
    assert w.composer.text() == "my question, typed before the drop"
    assert w.composer.notice.isVisibleTo(w)


def test_files_are_read_off_the_gui_thread_and_a_send_waits_for_them(
    qtbot, make_window, tmp_path, monkeypatch
):
    """Reading a file (a 180 Mpx PNG's thumbnail takes over a second) runs on a worker: the
    drop returns at once, and Enter pressed meanwhile sends the message with the image once
    it is read, never without it."""
    import threading

    from merlin.app.widgets import composer

    gate, readers = threading.Event(), []
    real = composer.read_image

    def slow_read(path, name=None):
        readers.append(threading.current_thread())
        assert gate.wait(60)
        return real(path, name)

    monkeypatch.setattr(composer, "read_image", slow_read)
    w = make_window()
    drop(w, w.chat.viewport(), png(tmp_path / "lake.png"), png(tmp_path / "sea.png"))
    assert w.composer.attachments() == [] and not w.composer.chip_row.isVisibleTo(w)
    send(qtbot, w, "What is in the pictures?", wait=False)
    assert stored(w) == [] and w.composer.text() == "What is in the pictures?"
    gate.set()
    qtbot.waitUntil(lambda: len(stored(w)) == 2, timeout=60_000)
    wait_idle(qtbot, w)
    assert [i.name for i in stored(w)[0].images] == ["lake.png", "sea.png"]  # in drop order
    assert stored(w)[1].state == "done"
    assert readers and threading.main_thread() not in readers


def test_closing_waits_for_a_picture_being_read_but_not_for_ever(
    qtbot, make_window, tmp_path, monkeypatch
):
    """A picture still being read when the window closes is waited for up to
    window.CLOSE_READ_WAIT_S (a file that never comes, a hung network mount, does not hold
    the close) and named in the draft either way; a send that was waiting for it is called
    off, not started; the closed window's late delivery changes nothing on disk."""
    import threading
    import time

    from merlin.app.model.paths import data_dir as folder
    from merlin.app.widgets import window

    gates = gate_reads(monkeypatch, "never.png", "slow.png")
    monkeypatch.setattr(window, "CLOSE_READ_WAIT_S", 0.3)
    w = make_window()
    never = str(png(tmp_path / "never.png"))
    w.composer.add_paths([never])
    assert w.composer.wait_attachments(timeout=0.05) is False
    send(qtbot, w, "look at this", wait=False)  # Enter while it is read: the send waits
    start = time.monotonic()
    w.close()
    assert time.monotonic() - start < 5
    kept = drafts_on_disk(folder())
    assert kept.text == "look at this"
    assert [(i.name, i.path, i.sha256) for i in kept.images] == [("never.png", never, "")]
    gates["never.png"].set()
    qtbot.wait(1500)  # the read is delivered to the closed window (and its draft timer)
    assert drafts_on_disk(folder()) == kept
    monkeypatch.setattr(window, "CLOSE_READ_WAIT_S", 30)
    w2 = make_window()
    assert w2.store.conversations() == []  # the waiting send was not made at close
    w2.composer.wait_attachments()
    assert [a.name for a in w2.composer.attachments()] == ["never.png"]
    w2.composer.add_paths([str(png(tmp_path / "slow.png"))])
    threading.Timer(0.5, gates["slow.png"].set).start()
    w2.close()  # the read ends within the wait: the picture is in the draft, stored
    images = drafts_on_disk(folder()).images
    assert [i.name for i in images] == ["never.png", "slow.png"] and all(i.sha256 for i in images)


def test_pictures_being_put_back_stay_in_the_draft_until_they_are_read(
    qtbot, make_window, tmp_path, monkeypatch
):
    """At start the draft's pictures are read again on the worker; a draft save meanwhile
    (its text put back starts the timer) or a close before they are read still names them
    as before, store copy included, so the store's collection keeps sparing them."""
    import threading

    from merlin.app.model.paths import data_dir as folder
    from merlin.app.widgets import composer, window

    w1 = make_window()
    w1.composer.set_text("compare")
    w1.composer.add_paths([str(png(tmp_path / "cat.png"))])
    w1.composer.wait_attachments()
    w1.close()
    before = drafts_on_disk(folder())
    assert before.images and before.images[0].sha256
    gate = threading.Event()
    real = composer.read_image
    monkeypatch.setattr(composer, "read_image", lambda p, n=None: gate.wait(60) and real(p, n))
    monkeypatch.setattr(window, "CLOSE_READ_WAIT_S", 0.1)
    w2 = make_window()
    qtbot.wait(1500)  # past the draft timer started by the text put back
    assert drafts_on_disk(folder()) == before
    w2.close()
    assert drafts_on_disk(folder()) == before
    gate.set()


def test_a_send_waiting_for_files_is_called_off_when_one_cannot_be_attached(
    qtbot, make_window, tmp_path, monkeypatch
):
    """Enter pressed while a good and a damaged file are read: the message is not sent
    without the damaged one; the notice says why, and text and picture stay in the box. The
    box takes no typing while a send waits (what goes is what was there at Enter)."""
    import threading

    from merlin.app.widgets import composer

    gate = threading.Event()
    real = composer.read_image
    monkeypatch.setattr(composer, "read_image", lambda p, n=None: gate.wait(60) and real(p, n))
    w = make_window()
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 50)
    w.composer.add_paths([str(png(tmp_path / "good.png")), str(bad)])
    send(qtbot, w, "compare them", wait=False)
    assert w.composer.edit.isReadOnly()
    gate.set()
    w.composer.wait_attachments()
    assert stored(w) == [] and w.composer.text() == "compare them"
    assert [a.name for a in w.composer.attachments()] == ["good.png"]
    assert "bad.png" in w.composer.notice.text() and not w.composer.edit.isReadOnly()


def test_editing_while_a_send_waits_keeps_the_draft_and_sends_nothing(
    qtbot, make_window, tmp_path, monkeypatch
):
    import threading

    from merlin.app.widgets import composer

    w = make_window()
    send(qtbot, w, "first question")
    first = stored(w)[0]
    gate = threading.Event()
    real = composer.read_image
    monkeypatch.setattr(composer, "read_image", lambda p, n=None: gate.wait(60) and real(p, n))
    w.composer.add_paths([str(png(tmp_path / "lake.png"))])
    send(qtbot, w, "a new question", wait=False)  # waits for the picture
    gate.set()
    w.controller.begin_edit(first.id)
    assert w.composer.editing and w.composer.text() == "first question"
    assert len(stored(w)) == 2  # nothing sent
    w.composer.cancel_edit()
    assert w.composer.text() == "a new question"
    qtbot.waitUntil(lambda: [a.name for a in w.composer.attachments()] == ["lake.png"])
    qtbot.wait(200)
    assert len(stored(w)) == 2  # the send waiting for the picture stays called off


def test_files_still_being_read_are_dropped_when_the_composer_is_cleared(
    qtbot, make_window, tmp_path, monkeypatch
):
    import threading

    from merlin.app.widgets import composer

    gate = threading.Event()
    real = composer.read_image
    monkeypatch.setattr(composer, "read_image", lambda p, n=None: gate.wait(60) and real(p, n))
    w = make_window()
    w.composer.add_paths([str(png(tmp_path / "old.png"))])
    w.composer.clear()
    send(qtbot, w, "no picture")  # not held back by the dropped reading
    assert [r.text for r in stored(w)][:1] == ["no picture"] and stored(w)[0].images == []
    gate.set()
    w.composer.wait_attachments()
    assert w.composer.attachments() == []
    w.composer.add_paths([str(png(tmp_path / "new.png"))])
    w.composer.wait_attachments()
    assert [a.name for a in w.composer.attachments()] == ["new.png"]


def test_a_bad_file_is_reported_while_another_is_still_being_read(
    qtbot, make_window, tmp_path, monkeypatch
):
    import threading

    from merlin.app.widgets import composer

    gate = threading.Event()
    real = composer.read_image

    def read(path, name=None):
        if "slow" in str(path):
            assert gate.wait(60)
        return real(path, name)

    monkeypatch.setattr(composer, "read_image", read)
    w = make_window()
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    w.composer.add_paths([str(notes)])
    w.composer.add_paths([str(png(tmp_path / "slow.png"))])
    qtbot.wait(300)  # the text file's reading is over, the picture's is not
    gate.set()
    w.composer.wait_attachments()
    assert [a.name for a in w.composer.attachments()] == ["slow.png"]
    assert "notes.txt" in w.composer.notice.text() and "not an image" in w.composer.notice.text()


def test_engine_error_is_shown_and_the_app_keeps_working(qtbot, make_window):
    w = make_window(context_budget=8)  # the prompt cannot fit: the engine refuses it
    send(qtbot, w, "a question that does not fit")
    rows = stored(w)
    assert rows[0].text == "a question that does not fit"  # kept
    assert rows[1].state == "error"
    answer = w.chat.messages()[-1]
    assert "context" in answer.note.text() and answer.note.isVisibleTo(w)
    assert w.notice_banner.isVisibleTo(w) and "failed" in w.notice_banner.text()
    w.settings.context_budget = 4096
    qtbot.mouseClick(answer.regenerate_button, Qt.LeftButton)
    wait_idle(qtbot, w)
    assert stored(w)[-1].state == "done"


def test_unexpected_engine_exception_is_shown(qtbot, make_window, monkeypatch):
    from merlin.app import worker

    w = make_window()

    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    original = worker.answer_options
    monkeypatch.setattr(worker, "answer_options", boom)
    send(qtbot, w, "hello")
    assert stored(w)[-1].state == "error"
    assert "kernel exploded" in w.chat.messages()[-1].note.text()
    # only this patch is undone: monkeypatch.undo() would also drop MERLIN_DATA_DIR, and the
    # window would then save its settings into the user's own data folder
    monkeypatch.setattr(worker, "answer_options", original)
    send(qtbot, w, "hello again")
    assert stored(w)[-1].state == "done"
    assert [r.text for r in stored(w) if r.role == "user"] == ["hello", "hello again"]


def test_folder_that_is_not_a_checkpoint(qtbot, make_window, tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "readme.txt").write_text("hi")
    w = make_window(model=str(folder))
    assert w.controller.model is None
    text = w.model_banner.text()
    assert "Could not load the model" in text and "config.json" in text
    send(qtbot, w, "typed with no model", wait=False)
    assert stored(w)[0].text == "typed with no model"  # saved, answered once a model loads
    assert "waiting" in w.chat.messages()[0].status.text()
    assert folder_problem(str(folder)).startswith(str(folder))
    dialog = ModelDialog(ModelChoice("demo", "f32", "f32"), [], found=[], parent=w)
    dialog.select_folder(str(folder))
    assert not dialog.buttons.button(dialog.buttons.StandardButton.Ok).isEnabled()
    assert "config.json" in dialog.problem.text()
    dialog.list.setCurrentRow(0)
    assert dialog.buttons.button(dialog.buttons.StandardButton.Ok).isEnabled()
    assert dialog.choice().source == "demo"
    dialog.deleteLater()
    # loading a good model answers the waiting message
    w.controller.load_model(w.controller.loading.source if w.controller.loading else "demo")
    qtbot.waitUntil(lambda: len(stored(w)) == 2 and not w.controller.busy, timeout=120_000)
    assert stored(w)[1].state == "done"


def endless_load(monkeypatch):
    """The engine's load reports progress until it is cancelled (a load that cannot finish
    before the test's Cancel)."""
    import time

    import merlin.engine.model as model_mod

    def load_model(folder, *args, progress=None, **kwargs):
        while True:
            progress(0.5, "reading the weights")  # raises once cancelled
            time.sleep(0.01)

    monkeypatch.setattr(model_mod, "load_model", load_model)


def test_load_can_be_cancelled_and_the_previous_model_stays(
    qtbot, make_window, demo_dir, monkeypatch
):
    """Cancel on the load banner: the banner goes, the model label names the model in use
    (both had stayed on "Loading…" for good) and the settings keep the model that loaded
    (the cancelled choice had become the next start's)."""
    w = make_window()
    first = w.controller.model
    weights = w.settings.weights
    endless_load(monkeypatch)
    w.load(str(demo_dir), "q8", "q8")
    qtbot.waitUntil(lambda: w.load_banner.isVisible(), timeout=10_000)
    w.load_banner.sig_action.emit()  # its Cancel button
    qtbot.waitUntil(lambda: w.controller.loading is None, timeout=120_000)
    assert w.controller.model is first and not w.load_banner.isVisible()
    assert w.model_label.text() != "Loading…" and first.weights in w.model_label.text()
    assert w.settings.weights == weights != "q8"
    monkeypatch.undo()
    send(qtbot, w, "still works?")
    assert stored(w)[-1].state == "done"


def test_a_first_load_cancelled_offers_to_choose_a_model(qtbot, make_window, monkeypatch):
    endless_load(monkeypatch)
    w = make_window(wait=False)
    qtbot.waitUntil(lambda: w.load_banner.isVisible(), timeout=10_000)
    w.load_banner.sig_action.emit()
    qtbot.waitUntil(lambda: w.controller.loading is None, timeout=120_000)
    assert w.controller.model is None and not w.load_banner.isVisible()
    assert w.model_label.text() == "No model loaded"
    assert w.model_banner.isVisible() and "No model is loaded" in w.model_banner.label.text()
    assert w.model_banner.action.text() == "Choose a model…"


def test_engine_formats_are_attached_as_they_are(qtbot, data_dir, tmp_path):  # noqa: F811
    """A JPEG or PNG goes to the engine as the user's own file (it had been re-encoded as a PNG
    on the GUI thread: a 12 Mpx photo took a second and stored a file several times larger)."""
    from PIL import Image

    from merlin.app.widgets.attachments import read_image

    for name in ("photo.jpg", "drawing.png", "scan.webp"):
        path = tmp_path / name
        Image.new("RGB", (400, 300), (30, 90, 200)).save(path)
        a = read_image(path)
        assert a.path == str(path) and a.size == (400, 300) and not a.thumbnail.isNull()


def test_a_picture_the_engine_would_refuse_is_not_attached(qtbot, data_dir, tmp_path):  # noqa: F811
    """A truncated JPEG (a half-downloaded photo: Qt shows it grey-filled) or a strip over
    Qwen3-VL's 200:1 had been attached and sent, and then every later question of that chat
    failed on it; they are refused at once with the engine's reason, and so is a shape the
    engine takes (the same picture whole) accepted."""
    import io

    import numpy as np
    import pytest
    from PIL import Image

    from merlin.app.widgets.attachments import AttachmentError, read_image

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (400, 400, 3), dtype=np.uint8)).save(buf, "JPEG")
    whole, half = tmp_path / "whole.jpg", tmp_path / "half.jpg"
    whole.write_bytes(buf.getvalue())
    half.write_bytes(buf.getvalue()[: len(buf.getvalue()) * 2 // 3])
    strip, tall = tmp_path / "strip.png", tmp_path / "tall.png"
    Image.new("RGB", (1000, 4), "red").save(strip)
    Image.new("RGB", (2, 600), "red").save(tall)
    assert read_image(whole).size == (400, 400)
    for path, why in ((half, "truncated"), (strip, "aspect ratio"), (tall, "aspect ratio")):
        with pytest.raises(AttachmentError, match=why) as e:
            read_image(path)
        assert str(e.value).startswith(f"{path.name} was not attached: the image")


def test_an_image_over_qts_default_limit_but_within_the_engines_attaches(qtbot, data_dir, tmp_path):  # noqa: F811
    """8200 x 8200 RGB: 269 MB decoded, over Qt's default 256 MB allocation limit (refused as
    "could not be read"), within the engine's MAX_PIXELS."""
    from PIL import Image

    from merlin.app.widgets.attachments import MAX_PIXELS, read_image

    path = tmp_path / "panorama.png"
    Image.new("RGB", (8200, 8200), (200, 120, 40)).save(path, compress_level=1)
    assert 8200 * 8200 * 4 > 256 << 20 and 8200 * 8200 <= MAX_PIXELS
    a = read_image(path)
    assert a.path == str(path) and a.size == (8200, 8200) and not a.thumbnail.isNull()


def test_chat_thumbnails_are_decoded_off_the_gui_thread_at_the_size_shown(
    qtbot, make_window, tmp_path, monkeypatch
):
    """A sent picture's thumbnail in the chat comes from a worker (it was a whole decode of
    the photo on the GUI thread, again at every opening of the chat); a missing file says
    so; a second showing comes from the kept thumbnails."""
    import threading

    from merlin.app.widgets import thumbnails as thumbs
    from merlin.app.widgets.chat_view import THUMB_HEIGHT

    readers = []
    real = thumbs.read_thumbnail

    def read(*args):
        readers.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(thumbs, "read_thumbnail", read)
    w = make_window()
    w.composer.add_paths([str(png(tmp_path / "wide.png", 3000, 500))])
    w.composer.wait_attachments()
    send(qtbot, w, "What is this?")
    thumbs.thumbnails().wait()
    label = w.chat.messages()[0].thumbs.itemAt(0).widget()
    pm = label.pixmap()
    dpr = pm.devicePixelRatio()
    assert round(pm.height() / dpr) == THUMB_HEIGHT and round(pm.width() / dpr) == 3 * THUMB_HEIGHT
    assert readers and threading.main_thread() not in readers
    seen = len(readers)
    cid = w.controller.current_id
    w.controller.new_conversation()
    w.controller.open_conversation(cid)
    thumbs.thumbnails().wait()
    assert len(readers) == seen  # kept
    assert not w.chat.messages()[0].thumbs.itemAt(0).widget().pixmap().isNull()
    missing = w.chat.messages()[0]
    missing.set_images([str(tmp_path / "gone.png")])
    thumbs.thumbnails().wait()
    assert missing.thumbs.itemAt(1).widget().text() == "[image missing]"


def test_an_attached_image_is_copied_into_the_store_off_the_gui_thread(
    qtbot, make_window, tmp_path, monkeypatch
):
    """The copy into the chat store (read, hash, write, fsync: about a second for a 10 MB
    photo on a board's SD card) is made while the file is read, on the worker; sending then
    only checks it is there. Had it gone meanwhile, sending copies it again."""
    import threading

    from merlin.app.model.store import Store

    copies = []
    real = Store.import_image

    def import_image(self, source, name=None):
        copies.append(threading.current_thread())
        return real(self, source, name)

    monkeypatch.setattr(Store, "import_image", import_image)
    w = make_window()
    drop(w, w.chat.viewport(), png(tmp_path / "lake.png"))
    w.composer.wait_attachments()
    send(qtbot, w, "What is in the picture?")
    assert len(copies) == 1 and copies[0] is not threading.main_thread()
    ref = stored(w)[0].images[0]
    assert w.store.image_path(ref).read_bytes() == (tmp_path / "lake.png").read_bytes()
    # its copy removed before sending (a collection after the grace period): copied again
    drop(w, w.chat.viewport(), png(tmp_path / "sea.png", color="#119911"))
    w.composer.wait_attachments()
    w.store.image_path(w.composer.attachments()[0].stored).unlink()
    send(qtbot, w, "And this one?")
    assert len(copies) == 3 and copies[2] is threading.main_thread()
    assert w.store.image_path(stored(w)[2].images[0]).is_file()


def test_a_pasted_png_is_kept_as_its_bytes_and_decoded_off_the_gui_thread(qtbot, make_window):
    """A paste that carries a PNG (or BMP) file's bytes is attached as those bytes (no decode
    on the GUI thread, no PNG encode of the decoded pixels); one that carries only pixels
    still works."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice

    w = make_window()
    image = QImage(120, 90, QImage.Format_RGB32)
    image.fill(QColor("#4C78A8"))
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.WriteOnly)
    image.save(buffer, "PNG")
    mime = QMimeData()
    mime.setData("image/png", data)
    assert w.composer.add_mime(mime) == 1
    w.composer.wait_attachments()
    (a,) = w.composer.attachments()
    assert open(a.path, "rb").read() == bytes(data.data()) and a.size == (120, 90)
    pixels = QMimeData()
    pixels.setImageData(image)
    assert w.composer.add_mime(pixels) == 1
    w.composer.wait_attachments()
    assert len(w.composer.attachments()) == 2 and w.composer.attachments()[1].size == (120, 90)
    # a BMP's bytes (what some X11 and Windows programs put on the clipboard) likewise
    bmp = QByteArray()
    buffer = QBuffer(bmp)
    buffer.open(QIODevice.WriteOnly)
    image.scaled(60, 45).save(buffer, "BMP")
    mime = QMimeData()
    mime.setData("image/bmp", bmp)
    assert w.composer.add_mime(mime) == 1
    w.composer.wait_attachments()
    third = w.composer.attachments()[2]
    assert third.path.endswith(".bmp") and open(third.path, "rb").read() == bytes(bmp.data())
    assert third.size == (60, 45)


def test_editing_never_waits_for_the_drafts_pictures_and_they_come_back_with_it(
    qtbot, make_window, tmp_path, monkeypatch
):
    """Editing an earlier message while the draft's pictures are still being read (a hung
    mount) starts at once; a picture read during the edit joins the put-aside draft (and
    its file on disk), one still being read when the edit ends comes back with the draft, and
    a picture added to the edit is not held back by them."""
    import time

    gates = gate_reads(monkeypatch, *("during.png", "after.png"))
    w = make_window()
    send(qtbot, w, "first question")
    first = stored(w)[0]
    w.composer.set_text("my draft")
    w.composer.add_paths([str(png(tmp_path / "during.png"))])
    w.composer.add_paths([str(png(tmp_path / "after.png"))])
    start = time.monotonic()
    w.controller.begin_edit(first.id)
    assert time.monotonic() - start < 1 and w.composer.editing
    assert w.composer.text() == "first question" and w.composer.attachments() == []
    assert [name for _, name, _ in w.composer.draft()[2]] == ["during.png", "after.png"]

    w.composer.add_paths([str(png(tmp_path / "edit.png"))])  # read at once
    qtbot.waitUntil(lambda: [a.name for a in w.composer.attachments()] == ["edit.png"])
    gates["during.png"].set()
    # the draft on disk: the put-aside one's pictures, then the one added to the edit
    qtbot.waitUntil(lambda: [a.name for a in w.composer.draft()[1]] == ["during.png", "edit.png"])
    assert [a.name for a in w.composer.attachments()] == ["edit.png"]  # not into the edit

    w.composer.cancel_edit()
    assert w.composer.text() == "my draft"
    assert [a.name for a in w.composer.attachments()] == ["during.png"]
    gates["after.png"].set()
    qtbot.waitUntil(lambda: len(w.composer.attachments()) == 2)
    assert [a.name for a in w.composer.attachments()] == ["during.png", "after.png"]


def test_a_picture_still_being_read_for_an_edit_left_unsent_comes_with_the_draft(
    qtbot, make_window, tmp_path, monkeypatch
):
    """Another chat opened while a picture dropped on the edit is still being read: it
    joins the draft with the rewrite when it is read (it had been dropped)."""
    gates = gate_reads(monkeypatch, "late.png")
    w = make_window()
    send(qtbot, w, "first question")
    first = stored(w)[0]
    w.composer.set_text("my draft")
    w.controller.begin_edit(first.id)
    w.composer.set_text("first question, rewritten")
    w.composer.add_paths([str(png(tmp_path / "late.png"))])
    w.controller.open_conversation(None)  # a new chat: the edit is left
    assert not w.composer.editing
    assert w.composer.text() == "my draft\n\nfirst question, rewritten"
    gates["late.png"].set()
    qtbot.waitUntil(lambda: [a.name for a in w.composer.attachments()] == ["late.png"])


def test_a_draft_picture_that_fails_during_an_edit_is_reported_with_the_draft(
    qtbot, make_window, tmp_path, monkeypatch
):
    """A put-aside draft's picture that turns out unreadable during an edit does not call off
    the edit's waiting send nor show under it; it is reported when the draft comes back."""
    gates = gate_reads(monkeypatch, *("bad.png", "edit.png"))
    w = make_window()
    send(qtbot, w, "first question")
    first = stored(w)[0]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a picture")
    w.composer.set_text("my draft")
    w.composer.add_paths([str(bad)])
    w.controller.begin_edit(first.id)
    w.composer.set_text("first question, edited")
    w.composer.add_paths([str(png(tmp_path / "edit.png"))])
    w.composer.submit()  # Enter: waits for edit.png
    gates["bad.png"].set()
    qtbot.wait(300)
    assert "bad.png" not in w.composer.notice.text()
    gates["edit.png"].set()
    qtbot.waitUntil(lambda: not w.composer.editing and not w.controller.busy, timeout=20000)
    assert "first question, edited" in [m.text for m in stored(w)]  # the edit was sent
    assert w.composer.text() == "my draft"  # the draft came back, its bad picture reported
    assert w.composer.attachments() == [] and "bad.png" in w.composer.notice.text()


def test_the_waiting_notice_goes_when_the_answer_starts(qtbot, make_window, monkeypatch):
    """ "Your message is saved and will be answered when the model is ready" had stayed on
    after the answer."""
    import threading

    import merlin.engine.model as model_mod

    go, real = threading.Event(), model_mod.load_model

    def gated(*args, **kwargs):
        assert go.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_mod, "load_model", gated)
    w = make_window(wait=False)
    send(qtbot, w, "Are you there?", wait=False)
    qtbot.waitUntil(lambda: w.notice_banner.isVisible(), timeout=10_000)
    assert "when the model is ready" in w.notice_banner.label.text()
    go.set()
    qtbot.waitUntil(lambda: len(stored(w)) == 2 and not w.controller.busy, timeout=120_000)
    assert not w.notice_banner.isVisible()
    assert [r.state for r in stored(w)] == ["done", "done"]


def test_a_file_that_cannot_be_read_is_not_called_damaged(tmp_path, monkeypatch):
    """A picture the user may not read was reported as "damaged or not really an image"."""
    from pathlib import Path

    from PIL import Image

    from merlin.app.widgets.attachments import AttachmentError, read_image

    locked = tmp_path / "locked.png"
    Image.new("RGB", (8, 8)).save(locked)
    opened = Path.open

    def no_permission(self, *args, **kwargs):
        if self == locked:  # as for a file of mode 000 (the tests may run as root)
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", no_permission)
    with pytest.raises(AttachmentError) as e:
        read_image(locked)
    assert "cannot be read (Permission denied)" in str(e.value)


def test_a_dropped_file_whose_name_is_not_utf8_is_attached(qtbot, make_window, tmp_path):
    """A file manager drops file:///.../bad%FFname.png for a name with the byte 0xFF; Qt's
    toLocalFile read it as UTF-8 and the picture "cannot be found"."""
    import os

    from PIL import Image
    from PySide6.QtCore import QMimeData, QUrl

    folder = os.fsencode(tmp_path)
    Image.new("RGB", (16, 16), (200, 0, 0)).save(os.fsdecode(folder + b"/bad\xffname.png"))
    mime = QMimeData()
    mime.setUrls([QUrl.fromEncoded(b"file://" + folder + b"/bad%FFname.png")])
    w = make_window()
    w.composer.add_mime(mime)
    w.composer.wait_attachments()
    assert len(w.composer.attachments()) == 1, w.composer.notice.text()
    w.save_draft()  # the draft keeps it (its path's bytes as they are)
    assert [i.name for i in drafts_on_disk(w.store.folder).images] == ["bad\ufffdname.png"]
    send(qtbot, w, "what is it?")  # saving it had raised on the name's escaped byte
    (question, answer) = w.store.messages(w.controller.current_id)
    assert [i.name for i in question.images] == ["bad\ufffdname.png"]
    assert answer.state == "done"
