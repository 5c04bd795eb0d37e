"""The app's remote engine (app/remote.py) against `merlin-cli serve` on 127.0.0.1, and
against a scripted server for what a real one does only sometimes (401, 429, 500, an error
in the stream, a connection dropped mid-answer, silence); then the GUI offscreen: the model
dialog's server fields, a chat answered by the server, the panel's remote note.

The same GUI run against llama.cpp's own server (llama-cpp-python) serving a GGUF of the demo
model is tests/app/test_remote_llamacpp.py (marker `peer`, scripts/test-peer.sh)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time

import pytest
from gui_helpers import (  # noqa: F401  # noqa: F401
    ANSWER_TIMEOUT_MS,
    LOAD_TIMEOUT_MS,
    app_settings,
    data_dir,
    make_window,
    send,
)
from PIL import Image

from merlin.app.model.prompting import GenerationOptions, Turn
from merlin.app.model.remote import (
    REMOTE_SOURCE,
    RemoteBackend,
    RemoteConfig,
    RemoteError,
    list_models,
    load_api_key,
    normalize_url,
    save_api_key,
)
from merlin.engine.generate import Finished, PrefillDone, Tokens
from merlin.engine.server.process import ServerProcess

GREEDY = GenerationOptions(
    sampling={"temperature": 0.0}, max_new_tokens=10, context_budget=0, spec_mode="off"
)


@pytest.fixture(scope="module")
def server(demo_dir):
    s = ServerProcess("--model", str(demo_dir))
    yield s
    s.stop()


def backend(url: str, **kw) -> RemoteBackend:
    model = kw.pop("model", "")
    return RemoteBackend(RemoteConfig(url, model=model, **kw))


def run(b: RemoteBackend, turns, options=GREEDY, cancel=None) -> list:
    return list(b.respond(turns, options, cancel))


def test_urls_and_models(server):
    assert normalize_url("127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert normalize_url("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(RemoteError):
        normalize_url("ftp://x")
    models = list_models(RemoteConfig(server.root))
    assert models == [server.health()["model"]]


def test_streamed_answer_gives_engine_events(server):
    import httpx

    b = backend(server.url, model=list_models(RemoteConfig(server.url))[0])
    events = run(b, [Turn("user", "Tell me about rivers.")])
    kinds = [type(e) for e in events]
    assert kinds[0] is PrefillDone and kinds[-1] is Finished and Tokens in kinds
    fin = events[-1]
    assert fin.reason == "max_tokens" and fin.totals["generated_tokens"] == 10
    text = "".join(e.text for e in events if isinstance(e, Tokens))
    assert fin.totals["text"] == text
    # the same request without streaming, straight to the server: the same answer
    body = b.request_body([Turn("user", "Tell me about rivers.")], GREEDY)
    body["stream"] = False
    del body["stream_options"]
    whole = httpx.post(server.url + "/chat/completions", json=body, timeout=60).json()
    assert whole["choices"][0]["message"]["content"] == text
    # usage: a second PrefillDone with what the server computed and what it had cached
    usage_pre = [e for e in events if isinstance(e, PrefillDone)][-1]
    assert usage_pre.n_tokens + usage_pre.reused == whole["usage"]["prompt_tokens"]
    assert fin.totals["prompt_tokens"] + fin.totals["reused_tokens"] > 0


def test_follow_up_with_an_image_is_sent_as_a_data_url(server, tmp_path):
    img = tmp_path / "pic.png"
    Image.new("RGB", (3000, 2000), (200, 30, 30)).save(img)  # scaled down before sending
    b = backend(server.url)
    turns = [Turn("user", "What is this?", [str(img)])]
    first = run(b, turns)[-1]
    assert first.reason == "max_tokens", first.totals
    turns += [Turn("assistant", first.totals["text"]), Turn("user", "And?")]
    second = run(b, turns)[-1]
    assert second.reason == "max_tokens"
    assert second.totals["reused_tokens"] > first.totals["prompt_tokens"] // 2  # prefix reused


def test_stop_keeps_the_answer_so_far(server):
    b = backend(server.url)
    cancel = threading.Event()
    events = []
    opts = GenerationOptions(sampling={"temperature": 0.0}, max_new_tokens=5000)
    for e in b.respond([Turn("user", "Talk for a long time.")], opts, cancel):
        events.append(e)
        if sum(isinstance(x, Tokens) for x in events) == 3:
            cancel.set()
    fin = events[-1]
    assert fin.reason == "cancelled"
    assert fin.totals["text"] == "".join(e.text for e in events if isinstance(e, Tokens))
    assert fin.totals["text"]
    deadline = time.monotonic() + 30
    while server.health()["busy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not server.health()["busy"]  # the server stopped generating too


# ---- a scripted server for failures ---------------------------------------------------------

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
CHUNK2 = b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}\n\n'


def _reply(status: str, body: bytes, extra: str = "", chunked_sse: bool = False) -> bytes:
    head = f"HTTP/1.1 {status}\r\n{extra}Connection: close\r\n"
    if chunked_sse:
        return (head + "Content-Type: text/event-stream\r\n\r\n").encode() + body
    return (
        head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


SCRIPTS = {
    "401": _reply("401 Unauthorized", b'{"error":{"message":"bad key"}}'),
    "429": _reply("429 Too Many Requests", b'{"error":{"message":"busy"}}', "Retry-After: 7\r\n"),
    "500": _reply("500 Internal Server Error", b'{"error":{"message":"boom"}}'),
    "drop": _reply("200 OK", CHUNK + CHUNK2, chunked_sse=True),  # then the socket closes
    "error_event": _reply(
        "200 OK", CHUNK + b'data: {"error":{"message":"out of memory"}}\n\n', chunked_sse=True
    ),
    "silent": None,
    "whole": _reply(
        "200 OK",
        b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":'
        + b'{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],'
        + b'"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}',
    ),
    "vllm404": _reply(
        "404 Not Found", b'{"object":"error","message":"The model `x` does not exist."}'
    ),
    "malformed": _reply(
        "200 OK",
        b"data: []\n\ndata: null\n\ndata: 5\n\n"
        + b'data: {"choices":["x"]}\n\ndata: {"choices":[{"delta":"x"}]}\n\n'
        + b'data: {"choices":[{"delta":{"content":5}}]}\n\n'
        + b'data: {"usage":5}\n\ndata: {"usage":{"prompt_tokens":"abc"}}\n\n'
        + CHUNK
        + b'data: {"choices":[{"delta":{"content":[{"type":"text","text":"lo"}]},'
        + b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
        chunked_sse=True,
    ),
    "slow": _reply("200 OK", CHUNK, chunked_sse=True),  # one chunk, then silence
    "trickle": _reply("200 OK", b'{"object":"list","data":[{"id":"' + b"m" * 160 + b'"}]}'),
}


def _read_request(conn) -> bytes:
    """One HTTP request's body (its headers read, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return b""
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length")]  # fmt: skip
    while lengths and len(body) < int(lengths[0]):
        body += conn.recv(65536)
    return body


@pytest.fixture
def scripted():
    """scripted(name) -> URL of a one-shot server playing SCRIPTS[name]."""
    socks = []

    def make(name: str) -> str:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        socks.append(srv)

        def serve():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                _read_request(conn)  # all of it: a close with bytes unread resets the stream
                if SCRIPTS[name] is None:
                    time.sleep(5)
                    return
                if name == "trickle":  # a model list, a byte every 50 ms (10 s in all)
                    head, _, body = SCRIPTS[name].partition(b"\r\n\r\n")
                    conn.sendall(head + b"\r\n\r\n")
                    for byte in body:
                        time.sleep(0.05)
                        with contextlib.suppress(OSError):
                            conn.sendall(bytes([byte]))
                    return
                if name in ("drop", "error_event", "slow", "malformed"):
                    head, _, body = SCRIPTS[name].partition(b"\r\n\r\n")
                    conn.sendall(head + b"\r\n\r\n")
                    time.sleep(0.05)
                    conn.sendall(body)
                    time.sleep(5 if name == "slow" else 0.05)
                    return  # closed without [DONE]
                conn.sendall(SCRIPTS[name])

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{srv.getsockname()[1]}/v1"

    yield make
    for s in socks:
        s.close()


@pytest.mark.parametrize(
    "name, fragments, text",
    [
        ("401", ["API key", "401", "bad key"], ""),  # no key given: "needs an API key"
        ("429", ["busy", "429", "7 s"], ""),
        ("500", ["failed", "500", "boom"], ""),
        ("drop", ["closed the connection", "kept"], "Hello"),
        ("error_event", ["out of memory"], "Hel"),
    ],
)
def test_server_failures_keep_the_text_and_say_what_happened(scripted, name, fragments, text):
    fin = run(backend(scripted(name)), [Turn("user", "hi")])[-1]
    assert isinstance(fin, Finished) and fin.reason == "error"
    notice = " ".join(fin.totals["notices"])
    for f in fragments:
        assert f in notice, notice
    assert fin.totals["text"] == text


def test_timeouts_and_refused_connections(scripted):
    fin = run(backend(scripted("silent"), read_timeout=0.5), [Turn("user", "hi")])[-1]
    assert fin.reason == "error" and "sent nothing" in fin.totals["notices"][0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    fin = run(backend(f"http://127.0.0.1:{port}"), [Turn("user", "hi")])[-1]
    assert fin.reason == "error" and "cannot connect" in fin.totals["notices"][0]
    with pytest.raises(RemoteError, match="cannot connect"):
        list_models(RemoteConfig(f"http://127.0.0.1:{port}"))
    with pytest.raises(RemoteError, match="sent no model list within 0.5 s"):
        list_models(RemoteConfig(scripted("silent"), read_timeout=0.5))


def test_a_model_list_trickled_a_byte_at_a_time_is_cut_off_in_time(scripted):
    """Each byte restarted the read timeout: the thread asking stayed until the last byte,
    long after the load had given up waiting for it."""
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="did not finish sending its model list within 0.5 s"):
        list_models(RemoteConfig(scripted("trickle")), within=0.5)
    assert time.monotonic() - t0 < 2.5


def test_fetching_models_from_a_silent_server_leaves_the_dialog_answering(qtbot, scripted):
    from merlin.app.widgets.remote_dialog import RemoteBox

    box = RemoteBox(RemoteConfig(scripted("silent")))
    qtbot.addWidget(box)
    t0 = time.monotonic()
    job = box.fetch()
    assert time.monotonic() - t0 < 1 and job.running and "Asking" in box.status.text()
    assert job.wait() is False and box.fetch_button.isEnabled()
    assert box.status.text() and "Asking" not in box.status.text()
    box.url.setText("http://[::1")  # an address the HTTP library itself refuses
    assert box.fetch().wait() is False and box.fetch_button.isEnabled()
    assert "Asking" not in box.status.text()


def test_api_key_lives_in_its_own_private_file(tmp_path):
    save_api_key(tmp_path, "sk-secret")
    path = tmp_path / "remote-api-key"
    assert load_api_key(tmp_path) == "sk-secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    save_api_key(tmp_path, "")
    assert not path.exists() and load_api_key(tmp_path) == ""


# ---- the GUI --------------------------------------------------------------------------------


def test_gui_answers_with_the_remote_server(qtbot, make_window, server, data_dir):  # noqa: F811
    from merlin.app.settings import load_settings, save_settings, settings_file

    save_api_key(data_dir, "anything")  # merlin-cli serve without a key ignores it
    window = make_window(
        model=REMOTE_SOURCE, remote_url=server.url, use_model_sampling=False, temperature=0.0
    )
    c = window.controller
    assert c.model is not None and c.model.source == REMOTE_SOURCE, c.model
    assert "not available remotely" in window.panel.model_label.text()
    send(qtbot, window, "Tell me about rivers.")
    rows = window.store.messages(c.current_id)
    assert rows[-1].role == "assistant" and rows[-1].text and rows[-1].state == "done"
    # tokens out from the server's usage (chunks are tokens only when each decodes to text)
    assert rows[-1].stats["tokens"] == 12 and rows[-1].stats["reason"] == "max_tokens"
    assert 1 <= window.stats.tokens <= 12 and window.stats.ttft_ms > 0
    assert window.stats.prefill_tokens > 0  # tokens in, from usage
    # a follow-up reuses the server's cache (usage reaches the panel)
    send(qtbot, window, "And then?")
    assert window.stats.reused_tokens > 0
    # the key is not in the settings file nor in the chats database
    s = window.settings
    save_settings(s)
    assert "anything" not in open(settings_file().fileName()).read()
    db = list(data_dir.glob("chats.sqlite3*"))
    assert db and all(b"anything" not in p.read_bytes() for p in db)
    assert load_settings().remote_url == server.url


def test_model_dialog_offers_the_server(qtbot, server, data_dir):  # noqa: F811
    from merlin.app.widgets.model_dialog import ModelChoice, ModelDialog

    d = ModelDialog(ModelChoice("demo", "q4", "q8"), [], found=[])
    qtbot.addWidget(d)
    d.show()
    d.list.setCurrentItem(d._find(REMOTE_SOURCE))
    assert d.remote.isVisible() and not d.formats.isVisible()
    assert not d.buttons.button(d.buttons.StandardButton.Ok).isEnabled()  # no address yet
    d.remote.url.setText(server.url)
    assert d.buttons.button(d.buttons.StandardButton.Ok).isEnabled()
    job = d.remote.fetch()
    assert not d.remote.fetch_button.isEnabled()  # asked on a worker, the dialog answering
    assert job.wait()
    assert d.remote.fetch_button.isEnabled()
    assert d.remote.model.currentText() == server.health()["model"]
    choice = d.choice()
    assert choice.source == REMOTE_SOURCE and choice.remote.base_url == server.url
    d.remote.url.setText("127.0.0.1:1")
    assert not d.remote.fetch().wait() and "cannot connect" in d.remote.status.text()


def test_stop_works_while_the_server_is_silent(scripted):
    cancel = threading.Event()
    b = backend(scripted("slow"), read_timeout=60)
    events = []
    t0 = time.monotonic()
    for e in b.respond([Turn("user", "hi")], GREEDY, cancel):
        events.append(e)
        if isinstance(e, Tokens):
            threading.Timer(0.3, cancel.set).start()  # the Stop button, while nothing comes
    assert time.monotonic() - t0 < 4
    assert events[-1].reason == "cancelled" and events[-1].totals["text"] == "Hel"


def test_events_of_the_wrong_shape_are_skipped(scripted):
    """Valid JSON that is not an event of the API ([] or null, a string choice, a number
    for content or usage) is skipped like a comment; content given as parts is text (they
    had raised TypeError / AttributeError and the answer failed as an engine bug)."""
    fin = run(backend(scripted("malformed")), [Turn("user", "hi")])[-1]
    assert isinstance(fin, Finished) and fin.reason == "stop_token", fin.totals
    assert fin.totals["text"] == "Hello"


def test_stop_works_before_the_server_answers_at_all():
    """A server that accepted the request and has sent nothing yet (busy with others):
    Stop ends the answer at once (it waited for the server's headers, up to the timeout),
    and the server sees the connection close then (it had computed on for nobody)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    closed = threading.Event()

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.settimeout(20)
            try:
                while conn.recv(1024):
                    pass
            except OSError:
                pass
            closed.set()  # end of file: the client closed the connection

    threading.Thread(target=serve, daemon=True).start()
    cancel = threading.Event()
    b = backend(f"http://127.0.0.1:{srv.getsockname()[1]}/v1", read_timeout=60)
    threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    events = list(b.respond([Turn("user", "hi")], GREEDY, cancel))
    assert time.monotonic() - t0 < 2
    assert events[-1].reason == "cancelled"
    assert closed.wait(3)
    srv.close()


def test_an_address_or_key_a_client_cannot_use_is_refused_before_loading():
    from merlin.app.model.remote import check_api_key, normalize_url

    for url in ("http://[::1/v1", "https://:8000"):
        with pytest.raises(RemoteError):
            normalize_url(url)
    with pytest.raises(RemoteError, match="printable ASCII"):
        check_api_key("sk-clé")
    assert check_api_key("sk-abc_123") == "sk-abc_123"


def test_a_remote_load_always_ends(scripted, monkeypatch):
    """Whatever fails while asking the server (here a key a header cannot carry, as the
    dialog would have let through before), the load ends with a message: it had raised
    out of the worker's slot and the window stayed "Loading" for good. Cancel during a
    silent model list ends it at once."""
    from merlin.app import remote_worker

    class Worker:
        def __init__(self):
            self.ends = []
            self.sig_load_progress = type("S", (), {"emit": lambda *a: None})()
            self.sig_load_failed = type("S", (), {"emit": lambda _s, m: self.ends.append(m)})()
            self.sig_load_cancelled = type(
                "S", (), {"emit": lambda _s: self.ends.append("cancelled")}
            )()
            self.sig_loaded = type("S", (), {"emit": lambda _s, i: self.ends.append(i)})()

    class Request:
        def __init__(self, config):
            self.remote, self.source, self.cancel = config, "remote", threading.Event()

    w = Worker()
    remote_worker.connect(w, Request(RemoteConfig(scripted("silent"), api_key="sk-clé")))
    assert len(w.ends) == 1 and "API key" in w.ends[0]
    w = Worker()
    request = Request(RemoteConfig(scripted("silent")))
    threading.Timer(0.3, request.cancel.set).start()
    t0 = time.monotonic()
    remote_worker.connect(w, request)
    assert w.ends == ["cancelled"] and time.monotonic() - t0 < 2


def test_a_server_that_ignores_stream_and_one_that_words_errors_its_own_way(scripted):
    """A whole chat.completion where a stream was asked for is the answer (it had been an
    error that lost it); vLLM's error body is shown (only OpenAI's had been)."""
    fin = run(backend(scripted("whole")), [Turn("user", "hi")])[-1]
    assert fin.reason == "stop_token" and fin.totals["text"] == "Hello there"
    assert fin.totals["generated_tokens"] == 2
    fin = run(backend(scripted("vllm404")), [Turn("user", "hi")])[-1]
    assert fin.reason == "error" and "does not exist" in fin.totals["notices"][0]


def _raw(status: str, ctype: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\n{extra}Connection: close\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


WHOLE = (
    b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}]}'
)
SCRIPTS.update(
    {
        "html502": _raw(
            "502 Bad Gateway",
            "text/html",
            b"<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1>"
            b"<a href='http://evil.example/'>click</a></body></html>",
        ),
        "429date": _reply(
            "429 Too Many Requests",
            b'{"error":{"message":"busy"}}',
            "Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\n",
        ),
        "done_no_reason": _reply("200 OK", CHUNK + CHUNK2 + b"data: [DONE]\n\n", chunked_sse=True),
        "error_null": _reply(
            "200 OK",
            CHUNK.replace(b'{"choices"', b'{"error":null,"choices"')
            + b'data: {"error":null,"choices":[{"delta":{"content":"lo"},"finish_reason":"stop"}]}'
            + b"\n\n",
            chunked_sse=True,
        ),
        "whole_plain": _raw("200 OK", "text/plain; charset=utf-8", WHOLE),
        "whole_upper": _raw("200 OK", "Application/JSON", WHOLE),
        "html200": _raw("200 OK", "text/html", b"<html><body>Log in to the Wi-Fi</body></html>"),
        "huge": _reply("200 OK", CHUNK + b"data: " + b"x" * (17 << 20), chunked_sse=True),
    }
)


def test_answers_servers_end_in_their_own_ways(scripted):
    """[DONE] without a finish_reason, `"error": null` in every chunk, and a whole answer sent
    as text/plain or Application/JSON are answers (each had been an error: "closed the
    connection before the answer was finished", "stopped the answer: None")."""
    for name, text in (("done_no_reason", "Hello"), ("error_null", "Hello"),
                       ("whole_plain", "Hello there"), ("whole_upper", "Hello there")):  # fmt: skip
        fin = run(backend(scripted(name)), [Turn("user", "hi")])[-1]
        assert fin.reason == "stop_token" and fin.totals["text"] == text, (name, fin.totals)


def test_what_servers_say_in_error_is_plain_words(scripted):
    fin = run(backend(scripted("html502")), [Turn("user", "hi")])[-1]
    assert fin.totals["notices"] == ["the server failed (502) (502 Bad Gateway)."]
    fin = run(backend(scripted("429date")), [Turn("user", "hi")])[-1]
    assert "try again shortly" in fin.totals["notices"][0] and "GMT" not in fin.totals["notices"][0]
    fin = run(backend(scripted("html200")), [Turn("user", "hi")])[-1]
    assert fin.reason == "error" and "answered with a web page" in fin.totals["notices"][0]
    fin = run(backend(scripted("huge")), [Turn("user", "hi")])[-1]
    assert fin.reason == "error" and "more than 16 MB" in fin.totals["notices"][0]
    assert fin.totals["text"] == "Hel"


def test_a_server_without_vision_answers_without_the_pictures(tmp_path):
    """A server refusing pictures (a model without vision) failed this turn and every later
    one (the picture is sent again each turn); it is asked again without them, and the
    answer says so."""
    import json

    picture = tmp_path / "pic.png"
    Image.new("RGB", (64, 48), "red").save(picture)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    bodies = []

    def serve():
        for reply in (
            _reply(
                "400 Bad Request",
                b'{"error":{"message":"This model does not support image input."}}',
            ),  # fmt: skip
            _reply("200 OK", CHUNK + CHUNK2.replace(b"null", b'"stop"'), chunked_sse=True),
        ):
            conn, _ = srv.accept()
            with conn:
                bodies.append(json.loads(_read_request(conn)))
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/v1"
        fin = run(backend(url), [Turn("user", "what is it?", [str(picture)])])[-1]
    finally:
        srv.close()
    assert fin.reason == "stop_token" and fin.totals["text"] == "Hello"
    assert fin.totals["notices"] == ["The server does not take pictures; it answered without them."]
    assert "image_url" in json.dumps(bodies[0]) and "image_url" not in json.dumps(bodies[1])


def test_stop_while_the_pictures_are_prepared_sends_nothing(tmp_path):
    picture = tmp_path / "pic.png"
    Image.new("RGB", (64, 48), "red").save(picture)
    cancel = threading.Event()
    cancel.set()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens: a request would say "cannot connect"
    turns = [Turn("user", "look", [str(picture)] * 4)]
    fin = run(backend(f"http://127.0.0.1:{port}"), turns, cancel=cancel)[-1]
    assert fin.reason == "cancelled" and not fin.totals["notices"]


def test_a_remote_answer_leaves_out_an_earlier_picture_the_engine_refuses(tmp_path):
    """With a remote model, one damaged picture of an earlier message failed every later
    question (the local engine leaves it out with a notice: so does the remote one now)."""
    from merlin.app.model.jobs import GenerationJob
    from merlin.app.worker import EngineWorker

    damaged = tmp_path / "lake.png"
    Image.new("RGB", (64, 48), "blue").save(damaged)
    damaged.write_bytes(damaged.read_bytes()[:60])  # cut short after it was sent
    seen, events = [], []

    class Server:
        def respond(self, turns, options, cancel):
            seen.append(turns)
            yield Finished.of("stop_token", {"generated_tokens": 1, "text": "ok", "notices": []})

    worker = EngineWorker()
    worker._remote = Server()
    worker.sig_event.connect(lambda job_id, event: events.append(event))
    turns = [Turn("user", "look", [str(damaged)]), Turn("assistant", "a lake"),
             Turn("user", "and now?")]  # fmt: skip
    worker.generate(GenerationJob(1, turns, GREEDY, image_names={str(damaged): "lake.png"}))
    assert [t.images for t in seen[0]] == [[], [], []]
    assert "lake.png" in events[-1].notices[0]


def test_the_saved_key_stays_with_its_server(qtbot):
    """The key saved for one server filled the field whatever address was typed, and a LAN
    server asked for its models received it."""
    from merlin.app.widgets.remote_dialog import RemoteBox

    box = RemoteBox(RemoteConfig("https://openrouter.ai/api/v1", "sk-secret", "m"))
    qtbot.addWidget(box)
    box.url.setText("http://192.168.1.5:8000/v1")
    assert box.key.text() == "" and box.config().api_key == ""
    box.url.setText("https://openrouter.ai/api/v1")
    assert box.key.text() == "sk-secret"
    box.url.setText("http://192.168.1.5:8000/v1")
    box.key.setText("lan-key")
    box.url.setText("http://192.168.1.5:8001/v1")
    assert box.key.text() == "lan-key"  # typed for this one: the user's to keep


SCRIPTS["endless"] = _reply("200 OK", CHUNK * 200, chunked_sse=True)


def test_addresses_keys_and_limits_as_a_user_gives_them(scripted):
    """An address pasted with its endpoint had become .../chat/completions/models (404); a
    password in the address was echoed in every message; a 401 with no key said the key was
    refused; a server that ignores max_tokens was read without end."""
    assert normalize_url("http://h:8000/v1/chat/completions") == "http://h:8000/v1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fin = run(backend(f"http://alice:hunter2@127.0.0.1:{port}"), [Turn("user", "hi")])[-1]
    assert (
        "hunter2" not in fin.totals["notices"][0] and "cannot connect" in fin.totals["notices"][0]
    )
    with pytest.raises(RemoteError) as e:
        list_models(RemoteConfig(f"http://alice:hunter2@127.0.0.1:{port}"))
    assert "hunter2" not in str(e.value)
    fin = run(backend(scripted("401")), [Turn("user", "hi")])[-1]
    assert "needs an API key" in fin.totals["notices"][0]
    fin = run(backend(scripted("endless")), [Turn("user", "hi")])[-1]  # max_new_tokens 10
    assert fin.reason == "max_tokens" and fin.totals["text"] == "Hel" * 37
    assert "did not stop at the answer's token limit" in fin.totals["notices"][0]
