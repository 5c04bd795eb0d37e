"""Model > Serve to other apps, through the real window offscreen on the demo checkpoint: the
loaded model answers the official `openai` client while the window stays usable, the app's
own question still works, a port in use is a notice (not a crash), and switching it off frees
the port."""

from __future__ import annotations

import socket
import threading

import openai
import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401

from merlin.engine.server.embedded import ServeOptions


def _ask(url: str, out: list) -> None:
    c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    r = c.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
    )
    out.append(r.choices[0].message.content)


def _status(window):
    return getattr(window, "serving_status", None)


def test_the_loaded_model_is_served_while_the_window_works(qtbot, make_window):
    w = make_window(max_new_tokens=4)
    w.controller.start_serving(ServeOptions(port=0, context=2048))
    qtbot.waitUntil(lambda: _status(w) is not None, timeout=60_000)
    status = _status(w)
    assert status.url.startswith("http://127.0.0.1:") and status.api_key is None, status
    assert w.act_serve.isChecked() and status.url in w.notice_banner.text()

    answers: list = []
    t = threading.Thread(target=_ask, args=(status.url, answers))
    t.start()
    send(qtbot, w, "And a question in the app")  # takes turns with the served request
    qtbot.waitUntil(lambda: bool(answers), timeout=120_000)
    t.join(10)
    assert isinstance(answers[0], str)
    rows = w.controller.store.messages(w.controller.current_id)
    assert [r.role for r in rows] == ["user", "assistant"] and rows[-1].state == "done"

    port = int(status.url.rsplit(":", 1)[1].split("/")[0])
    w.act_serve.trigger()  # switch it off
    qtbot.waitUntil(lambda: not _status(w).url, timeout=30_000)
    assert not w.act_serve.isChecked()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # nobody listens now
        s.connect(("127.0.0.1", port))


def test_a_port_in_use_is_a_notice(qtbot, make_window):
    w = make_window()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        w.controller.start_serving(ServeOptions(port=port))
        qtbot.waitUntil(lambda: _status(w) is not None, timeout=60_000)
    assert not _status(w).url and "cannot listen" in _status(w).message
    assert "choose another port" in _status(w).message and "--port" not in _status(w).message
    assert not w.act_serve.isChecked()
    assert "Not serving" in w.notice_banner.text()


def test_an_api_key_clients_cannot_send_is_refused(qtbot, make_window):
    """A key with letters beyond ASCII was announced, though no HTTP client can send it."""
    w = make_window()
    w.controller.start_serving(ServeOptions(port=0, api_key="mot de passe clé"))
    qtbot.waitUntil(lambda: _status(w) is not None, timeout=60_000)
    assert not _status(w).url and "printable ASCII" in _status(w).message


def test_served_to_the_network_the_address_shown_is_one_others_can_use(qtbot, make_window):
    """Serving on every interface said http://0.0.0.0:PORT/v1, which no other device can
    reach; the address shown is this computer's on its network."""
    w = make_window()
    w.controller.start_serving(ServeOptions(host="0.0.0.0", port=0, context=2048))
    qtbot.waitUntil(lambda: _status(w) is not None, timeout=60_000)
    try:
        assert _status(w).url and "0.0.0.0" not in _status(w).url
    finally:
        w.controller.stop_serving()
