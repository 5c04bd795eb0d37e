"""What a careless or hostile client gets from the server's HTTP layer, on a real uvicorn in
this process (engine/server/transport.py, app.py), with short deadlines: connections that send
nothing or drip their headers are closed, connections past the cap are closed as they come,
a body that stops arriving gets 408, a client leaving mid-body is no error in the log, form
posts (which any web page can send) are refused, and on loopback a request naming another
host (DNS rebinding) is refused."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from merlin.engine.server import app as server_app
from merlin.engine.server import transport
from merlin.engine.server.app import ServerConfig, create_app


@pytest.fixture
def served(monkeypatch):
    """(host, port) of the app on uvicorn with GuardedH11, loopback_only; an adapter that is
    never reached (every request here stops before the engine)."""
    import uvicorn

    monkeypatch.setattr(transport, "HEADER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(transport, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(server_app, "BODY_TIMEOUT_S", 0.5)
    adapter = SimpleNamespace(context_budget=2048, counts={})
    app = create_app(None, ServerConfig(model_name="m", loopback_only=True), adapter)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(transport.uvicorn_config(app))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()
    server.should_exit = True
    thread.join(10)
    sock.close()


def closed_within(conn: socket.socket, seconds: float) -> bool:
    """Does the server close `conn` (EOF) within `seconds`, sending nothing first?"""
    conn.settimeout(seconds)
    try:
        return conn.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def request(address, raw: bytes) -> bytes:
    with socket.create_connection(address) as conn:
        conn.sendall(raw)
        conn.settimeout(5)
        out = b""
        while b"\r\n\r\n" not in out or not out.endswith(b"}"):
            part = conn.recv(65536)
            if not part:
                break
            out += part
        return out


def post(host: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def test_silent_and_dripping_connections_are_closed(served):
    silent = socket.create_connection(served)
    dripping = socket.create_connection(served)
    dripping.sendall(b"GET /health HTTP/1.1\r\n")
    t0 = time.monotonic()
    assert closed_within(silent, 5) and closed_within(dripping, 5)
    assert time.monotonic() - t0 < 3
    ok = request(served, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200")  # the server still serves


def test_connections_past_the_cap_are_closed_as_they_come(served, monkeypatch):
    monkeypatch.setattr(transport, "HEADER_TIMEOUT_S", 10.0)  # the held ones stay
    held = [socket.create_connection(served) for _ in range(transport.MAX_CONNECTIONS)]
    time.sleep(0.3)
    extra = socket.create_connection(served)
    assert closed_within(extra, 2)  # long before the header deadline
    assert not closed_within(held[0], 0.1)
    for conn in held:
        conn.close()


def test_a_body_that_stops_arriving_gets_408_and_a_client_leaving_is_not_an_error(served, caplog):
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    answer = request(served, head + b'{"mes')
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer
    with caplog.at_level(logging.INFO):
        gone = socket.create_connection(served)
        gone.sendall(head + b'{"mes')
        gone.close()
        time.sleep(0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_form_posts_and_other_hosts_are_refused(served):
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        answer = request(served, post("127.0.0.1", body, kind))
        assert answer.startswith(b"HTTP/1.1 415") and b"application/json" in answer, kind
    for host in ("attacker.example", "attacker.example:8080", "10.0.0.2", "127.0.0.1.evil.test"):
        answer = request(served, post(host, body))
        assert answer.startswith(b"HTTP/1.1 421") and b"loopback" in answer, host
    health = b"GET /health HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n"
    assert request(served, health).startswith(b"HTTP/1.1 421")
    for host in ("127.0.0.1:8080", "localhost", "[::1]:9", "127.0.0.2"):
        ok = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        assert request(served, ok).startswith(b"HTTP/1.1 200"), host


def test_a_body_of_countless_empty_objects_is_refused_before_parsing(served):
    body = (
        b'{"messages": [{"role": "user", "content": "hi"}], "metadata": ['
        + b"{}," * (server_app.MAX_JSON_CONTAINERS)
        + b"{}]}"
    )
    answer = request(served, post("127.0.0.1", body))
    assert answer.startswith(b"HTTP/1.1 400") and b"JSON objects and arrays" in answer


def test_oversized_headers_and_garbage_get_a_json_error_not_a_reset(served, caplog):
    """Headers up to transport.MAX_HEADER_BYTES are served; past it the client reads a 431
    with an OpenAI-style error (uvicorn closed with the bytes unread: the client saw a
    connection reset), and a request that is not HTTP a 400, the same way."""
    import json

    def get(extra: str) -> bytes:
        return (
            f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n"
        ).encode()

    assert request(served, get(f"X-Big: {'a' * 60_000}\r\n")).startswith(b"HTTP/1.1 200")
    for extra, size in (("X-Big: {}\r\n", 200_000), ("Cookie: {}\r\n", 3_000_000)):
        out = request(served, get(extra.format("b" * size)))
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), head
        error = json.loads(body)["error"]
        assert "64 KB" in error["message"] and error["type"] == "invalid_request_error"
    bad_then_body = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n"
        b"Content-Length: 100000\r\n\r\n" + b"x" * 100_000
    )
    assert request(served, bad_then_body).startswith(b"HTTP/1.1 400")  # not "too large"
    out = request(served, b"\x16\x03\x01 this is TLS, not HTTP\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "not valid HTTP/1.1" in json.loads(body)["error"]["message"]
