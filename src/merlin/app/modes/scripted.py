"""`merlin --script FILE`: the real window, fed user messages from a file, for crash tests.

FILE holds one user message per line (blank lines are skipped). The window opens as usual
(the saved settings, MERLIN_DATA_DIR, --model/--weights/--kv; offscreen with
QT_QPA_PLATFORM=offscreen); the first message is sent at once, while the model loads (it is
stored as queued and answered when the model is ready), and each next one when the previous
answer has ended. The app exits 0 after the last answer, 1 if a message cannot be sent or the
model cannot load. Progress goes to stdout, one flushed line per event:

    SENT <message id> <line number>   the user message is committed to the chat store
    LOADED                            the model is ready
    ANSWERING                         an answer started streaming
    ANSWERED <state>                  it ended: done, stopped or error

A SENT line is printed only after send() returned, i.e. after the store's transaction
committed, so a test that kills the process (kill -9) may expect every message it saw a SENT
line for to be in the database (tests/robustness/test_kill_app.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def say(line: str) -> None:
    print(line, flush=True)


def read_messages(path: str) -> list[str]:
    text = Path(os.path.expanduser(path)).read_text(encoding="utf-8", errors="replace")
    return [line for line in text.splitlines() if line.strip()]


def run(script: str, model: str | None, weights: str | None, kv: str | None) -> int:
    try:
        messages = read_messages(script)
    except OSError as e:
        print(f"merlin: cannot read the script {script}: {e.strerror or e}", file=sys.stderr)
        return 2
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from merlin.app.widgets.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Merlin")
    window = MainWindow(model_folder=model, weights=weights, kv=kv)
    window.show()
    c = window.controller
    pending = list(enumerate(messages, start=1))

    def finish(code: int) -> None:
        window.close()  # stops the engine thread, closes the store
        app.exit(code)

    def send_next() -> None:
        if not pending:
            finish(0)
            return
        number, text = pending.pop(0)
        if not c.send(text):
            print(f"merlin: message {number} could not be sent", file=sys.stderr)
            finish(1)
            return
        rows = c.store.messages(c.current_id)
        say(f"SENT {max(r.id for r in rows if r.role == 'user')} {number}")

    def load_failed(message: str) -> None:
        print(f"merlin: the model failed to load: {message}", file=sys.stderr)
        finish(1)

    c.sig_model_changed.connect(lambda _info: say("LOADED"))
    c.sig_load_failed.connect(load_failed)
    c.sig_busy_changed.connect(lambda busy: say("ANSWERING") if busy else None)
    c.sig_answer_finished.connect(lambda state: say(f"ANSWERED {state}"))
    c.sig_answer_finished.connect(lambda _state: QTimer.singleShot(0, send_next))
    QTimer.singleShot(0, send_next)
    return app.exec()
