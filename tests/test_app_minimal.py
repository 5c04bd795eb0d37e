"""The window on the real engine and the demo checkpoint: loads, answers, never blocks."""

import time

from PySide6.QtCore import QTimer

from app.window import MainWindow


def test_window_loads_demo_and_streams_an_answer(qtbot, demo_dir):
    window = MainWindow(model_folder=str(demo_dir))
    qtbot.addWidget(window)
    window.show()
    gaps, last = [], [time.perf_counter()]

    def beat():
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    heartbeat = QTimer(interval=10)
    heartbeat.timeout.connect(beat)
    heartbeat.start()
    with qtbot.waitSignal(window.sig_model_ready, timeout=120_000):
        pass
    assert "Ready" in window.status.text()
    window.composer.setPlainText("Hello, what is in the picture?")
    window.send(window.composer.toPlainText())
    qtbot.waitUntil(lambda: not window._busy, timeout=120_000)
    heartbeat.stop()
    assert "Merlin" in window.chat.toPlainText()
    assert "tokens/s" in window.status.text()
    assert window.composer.toPlainText() == ""
    assert max(gaps) < 0.5  # the GUI thread never waited on the engine
    window.close()


def test_message_typed_while_loading_is_queued_not_lost(qtbot, demo_dir):
    window = MainWindow(model_folder=str(demo_dir))
    qtbot.addWidget(window)
    window.send("queued question")
    assert "queued question" in window.chat.toPlainText()
    qtbot.waitUntil(
        lambda: window._ready and not window._busy and window._queued is None, timeout=120_000
    )
    assert "Merlin" in window.chat.toPlainText()
    window.close()


def test_bad_model_folder_shows_message(qtbot, tmp_path):
    window = MainWindow(model_folder=str(tmp_path / "missing"))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.sig_model_ready, timeout=60_000):
        pass
    assert "Could not load" in window.status.text() and "no such folder" in window.status.text()
    window.close()
