"""`merlin-cli serve` on the demo checkpoint, driven by the official `openai` client (and raw
httpx for malformed bodies), all on 127.0.0.1: whole and streamed answers equal to
`merlin-cli generate`, images, KV prefix reuse (cached tokens in usage), cancellation by
closing the stream, the queue's 429, auth on and off, and bad requests: each a 4xx naming the
field, after which the next request is served."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import openai
import pytest
from PIL import Image
from support import run_cli

from merlin.engine.server.process import ServerProcess

KEY = "test-key-123"


def png_data_url(seed: int = 0, size=(64, 48)) -> str:
    img = Image.new("RGB", size, (40 + seed * 50, 120, 200 - seed * 30))
    for x in range(0, size[0], 8):
        img.putpixel((x, x % size[1]), (255, 255, 0))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("allowed")
    Image.new("RGB", (64, 64), (10, 200, 30)).save(d / "green.png")
    return d


@pytest.fixture(scope="module")
def server(demo_dir, images_dir):
    s = ServerProcess("--model", str(demo_dir), "--allow-images", str(images_dir))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict(demo_dir):
    """An API key, no waiting line, a smaller context and small images."""
    s = ServerProcess(
        "--model", str(demo_dir), "--api-key", KEY, "--queue", "0", "--context", "2048",
        "--max-image-mb", "0.05", "--max-body-mb", "1",
    )  # fmt: skip
    yield s
    s.stop()


def client(s: ServerProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url, api_key=key, max_retries=0, timeout=120)


GREEDY = dict(temperature=0, max_tokens=12, extra_body={"ignore_eos": True})


def ask(c, content, **kw):
    return c.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": content}], **{**GREEDY, **kw}
    )


def test_models_and_health(server):
    c = client(server)
    ids = [m.id for m in c.models.list().data]
    assert len(ids) == 1
    h = server.health()
    assert h["status"] == "ok" and h["model"] == ids[0]


def test_answer_equals_merlin_cli_generate(server, demo_dir):
    prompt = "Tell me about rivers."
    r = run_cli(
        "generate", "--model", str(demo_dir), prompt, "--temperature", "0",
        "--max-new-tokens", "12", "--ignore-eos", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    finished = json.loads(r.stdout.strip().splitlines()[-1])
    c = client(server)
    whole = ask(c, prompt)
    assert whole.choices[0].message.content == finished["text"]
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == finished["prompt_tokens"]
    # streamed: the same text, usage in a last chunk without choices
    stream = ask(c, prompt, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == finished["text"]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 12
    # the same question again: the whole prompt but its last row comes from the KV cache
    assert last.usage.prompt_tokens_details.cached_tokens == finished["prompt_tokens"] - 1
    merlin = last.model_extra["merlin"]
    assert merlin["profile"]["steps"] >= 1 and merlin["profile"]["total_ms"] > 0
    assert "mode" in merlin["spec"] and merlin["time_to_first_token_ms"] > 0


def test_follow_up_reuses_the_prefix(server):
    c = client(server)
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    a = c.chat.completions.create(model="demo", messages=first, **GREEDY)
    convo = [
        *first,
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    b = c.chat.completions.create(model="demo", messages=convo, **GREEDY)
    cached = b.usage.prompt_tokens_details.cached_tokens
    assert cached >= a.usage.prompt_tokens  # the first turn is not computed again
    assert b.usage.prompt_tokens > cached
    assert b.model_extra["merlin"]["prefill_ms"] >= 0


def test_images_data_url_and_allowed_file(server, images_dir):
    c = client(server)
    content = [
        {"type": "image_url", "image_url": {"url": png_data_url(1)}},
        {"type": "text", "text": "What is this?"},
    ]
    a = ask(c, content)
    assert a.model_extra["merlin"]["vision_ms"] > 0
    assert a.usage.prompt_tokens > 20  # the image's tokens
    follow = [
        {"role": "user", "content": content},
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "More?"},
    ]
    b = c.chat.completions.create(model="demo", messages=follow, **GREEDY)
    assert b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens
    assert b.model_extra["merlin"]["vision_ms"] == 0  # the image is not encoded again
    f = ask(c, [{"type": "image_url", "image_url": {"url": str(images_dir / "green.png")}}])
    assert f.usage.completion_tokens == 12
    g = ask(
        c, [{"type": "image_url", "image_url": {"url": "file://" + str(images_dir / "green.png")}}]
    )
    assert g.choices[0].message.content == f.choices[0].message.content


def test_a_question_before_its_picture_is_asked_in_that_order(server):
    """[text, image] is another prompt than [image, text] (the chat template renders parts
    in order): the second shares only the turn's opening with the first in the KV cache."""
    c = client(server)
    picture = {"type": "image_url", "image_url": {"url": png_data_url(7)}}
    question = {"type": "text", "text": "What colour is the picture below?"}
    a = ask(c, [picture, question])
    b = ask(c, [question, picture])
    assert b.usage.prompt_tokens == a.usage.prompt_tokens
    assert b.usage.prompt_tokens_details.cached_tokens < a.usage.prompt_tokens // 2
    again = ask(c, [question, picture])
    assert again.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens - 1


def test_closing_the_stream_cancels_the_generation(server):
    c = client(server)
    before = server.health()["cancelled"]
    stream = ask(c, "Go on forever.", stream=True, max_tokens=4000)
    got = 0
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            got += 1
            if got == 3:
                break
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.health()["cancelled"] == before:
        time.sleep(0.1)
    assert server.health()["cancelled"] == before + 1
    assert not server.health()["busy"]
    assert ask(c, "Still there?").usage.completion_tokens == 12


def test_auth_required_when_a_key_is_set(strict, server):
    with pytest.raises(openai.AuthenticationError):
        client(strict, "wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        ask(client(strict, "wrong"), "Hi")
    r = httpx.post(strict.url + "/chat/completions", json={"messages": []})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(strict.root + "/health").status_code == 200  # health needs no key
    assert ask(client(strict, KEY), "Hi").usage.completion_tokens == 12
    assert ask(client(server, "anything"), "Hi").usage.completion_tokens == 12  # auth off


def test_full_queue_answers_429(strict):
    c = client(strict, KEY)
    stream = ask(c, "Talk.", stream=True, max_tokens=2000)
    it = iter(stream)
    next(it)  # the running generation holds the engine
    r = httpx.post(
        strict.url + "/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"messages": [{"role": "user", "content": "me too"}], "max_tokens": 2},
    )
    stream.close()
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    deadline = time.monotonic() + 30
    while strict.health()["busy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ask(c, "Now?").usage.completion_tokens == 12


def post(s: ServerProcess, body, key: str | None = None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, (dict, list)):
        kw["json"] = body
    else:
        kw["content"] = body
        headers["Content-Type"] = "application/json"
    return httpx.post(s.url + "/chat/completions", headers=headers, timeout=60, **kw)


def user(content) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}


BAD = {
    "non-JSON": (b"{not json", None, "not valid JSON"),
    "not an object": ([1, 2], None, "JSON object"),
    "no messages": ({"model": "x"}, "messages", "missing"),
    "messages not an array": ({"messages": "hi"}, "messages", "array"),
    "temperature as text": ({**user("hi"), "temperature": "hot"}, "temperature", "number"),
    "max_tokens as float": ({**user("hi"), "max_tokens": 2.5}, "max_tokens", "integer"),
    "max_tokens huge": ({**user("hi"), "max_tokens": 10**9}, "max_tokens", "at most"),
    "stream as text": ({**user("hi"), "stream": "yes"}, "stream", "true or false"),
    "unknown role": (
        {"messages": [{"role": "wizard", "content": "hi"}]},
        "messages[0].role",
        "wizard",
    ),
    "content as number": (user(42), "messages[0].content", "string or an array"),
    "unknown part": (user([{"type": "audio"}]), "messages[0].content[0].type", "text"),
    "n = 2": ({**user("hi"), "n": 2}, "n", "must be 1"),
    "ends with assistant": (
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        "messages",
        "last message",
    ),
    "thousands of messages": (
        {"messages": [{"role": "user", "content": "hi"}] * 5000},
        "messages",
        "at most",
    ),
    "http image": (
        user([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]),
        "messages[0].content[0].image_url.url",
        "network",
    ),
    "path outside the folder": (
        user([{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]),
        "messages[0].content[0].image_url.url",
        "outside",
    ),
    "dot-dot path": (
        user([{"type": "image_url", "image_url": {"url": "../../../etc/hostname"}}]),
        "messages[0].content[0].image_url.url",
        "outside",
    ),
    "bad base64": (
        user([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]),
        "messages[0].content[0].image_url.url",
        "base64",
    ),
    "not an image": (
        user([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]),
        "messages[0].content[0].image_url.url",
        "not an image",
    ),
    "NUL in an image path": (
        user([{"type": "image_url", "image_url": {"url": "green.png\u0000.png"}}]),
        "messages[0].content[0].image_url.url",
        "not a usable file path",
    ),
    "image path too long": (
        user([{"type": "image_url", "image_url": {"url": "a" * 5000}}]),
        "messages[0].content[0].image_url.url",
        "not a usable file path",
    ),
    "max_tokens of 401 digits": ({**user("hi"), "max_tokens": 10**400}, "max_tokens", "at most"),
    "temperature of 401 digits": ({**user("hi"), "temperature": 10**400}, "temperature", "between"),
    "seed of 401 digits": ({**user("hi"), "seed": -(10**400)}, "seed", "between"),
    "a number of 5000 digits": (
        b'{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + b"0" * 5000 + b"}",
        None,
        "too long",
    ),
    "include_usage as text": (
        {**user("hi"), "stream": True, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
        "true or false",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_request_is_a_4xx_naming_the_field(server, case):
    body, param, fragment = BAD[case]
    r = post(server, body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert fragment in err["message"], err
    assert "Traceback" not in r.text
    assert server.alive()
    ok = post(server, user("hi"))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_limits_of_the_strict_server(strict):
    big_image = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + b"x" * 200_000).decode()
    r = post(strict, user([{"type": "image_url", "image_url": {"url": big_image}}]), KEY)
    assert r.status_code == 413 and r.json()["error"]["param"].endswith("image_url.url")
    assert "MB" in r.json()["error"]["message"]
    # a body over --max-body-mb, refused before it is parsed
    r = post(strict, user("x" * 2_000_000), KEY)
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    # longer than the context (2048 tokens)
    r = post(strict, user(" ".join(["river"] * 6000)), KEY)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages", err
    assert err["code"] == "context_length_exceeded"
    ok = post(strict, user("hi"), KEY)
    assert ok.status_code == 200, ok.text


def test_every_request_that_leaves_messages_out_says_so(strict):
    """The same over-long conversation sent twice: the second answer had an empty notices
    list though its oldest messages were still left out (the session had trimmed them for
    the first request); each request stands alone."""
    history = []
    for i in range(6):
        history += [{"role": "user", "content": f"turn {i} " + " ".join(["y"] * 700)},
                    {"role": "assistant", "content": "ok"}]  # fmt: skip
    body = {"messages": [*history, {"role": "user", "content": "and now?"}], "max_tokens": 2}
    for _ in range(2):
        r = post(strict, body, KEY)
        assert r.status_code == 200, r.text
        stats = r.json()["merlin"]
        assert stats["dropped_messages"] and any("left out" in n for n in stats["notices"])


def test_unknown_routes_and_methods_are_json_errors(server):
    r = httpx.get(server.root + "/nope")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_stop_strings_cut_the_answer(server):
    c = client(server)
    full = ask(c, "Count.", max_tokens=20).choices[0].message.content
    if len(full) < 6:
        pytest.fail(f"the demo answer is too short to test stop strings: {full!r}")
    stop = full[3:6]
    cut = ask(c, "Count.", max_tokens=20, stop=[stop])
    assert cut.choices[0].message.content == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_listening_beyond_loopback_always_has_a_key():
    from merlin.engine.server.cli import api_key_for, is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.20", "example.org"]))
    assert api_key_for("127.0.0.1", None) == (None, False)
    assert api_key_for("0.0.0.0", "mine") == ("mine", False)
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        key, generated = api_key_for(host, None)
        assert generated and len(key) >= 24
    assert api_key_for("0.0.0.0", None)[0] != api_key_for("0.0.0.0", None)[0]


def test_port_in_use_and_bad_folder_are_one_line_errors(demo_dir, tmp_path):
    import socket

    from support import assert_user_error

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_cli("serve", "--model", str(demo_dir), "--port", str(port), "--no-warm-up")
        assert_user_error(r, f"127.0.0.1:{port}", "--port")
    r = run_cli("serve", "--allow-images", str(tmp_path / "missing"))
    assert_user_error(r, "--allow-images", "no such folder")


def test_an_address_that_cannot_be_bound_shows_no_key_and_brackets_are_accepted(tmp_path):
    """A generated API key was printed for an address that then failed to bind; an IPv6
    host written as in a URL ([::1]) was refused."""
    from support import assert_user_error

    from merlin.engine.server.cli import is_loopback, unbracketed

    r = run_cli("serve", "--model", str(tmp_path / "missing"), "--host", "999.1.1.1")
    assert_user_error(r, "cannot listen on 999.1.1.1")
    assert "API key" not in r.stderr
    assert is_loopback("[::1]") and unbracketed("[::1]") == "::1" and unbracketed("::1") == "::1"


IMPOSSIBLE_OPTIONS = [
    ("--max-body-mb", "-1"),
    ("--max-image-mb", "0"),
    ("--context", "-5"),
    ("--sessions", "0"),
    ("--queue", "-1"),
    ("--port", "70000"),
    ("--spec-k", "0"),  # had started, and every answer carried the operator's error
    ("--spec-k", "9"),
]


@pytest.mark.parametrize("option,value", IMPOSSIBLE_OPTIONS)
def test_impossible_options_are_one_line_errors_at_startup(option, value, tmp_path, capsys):
    """Refused before the socket is bound or a model is read (the folder does not exist: a
    check that let the option through would fail on the model, with another message)."""
    from merlin.engine.cli import EXIT_USER_ERROR, main

    args = ["serve", "--model", str(tmp_path / "missing"), "--port", "0", option, value]
    assert main(args) == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"merlin-cli: error: {option} must be") and " from " in err, err
    assert "\n" not in err


def test_unusable_image_paths_are_400_on_the_field(tmp_path):
    """What the file system refuses (NUL, a name too long, ~nobody, a symbolic-link loop) is
    the client's mistake, named on its field, never an exception out of the resolver."""
    from merlin.engine.server.errors import ApiError
    from merlin.engine.server.images import ImageResolver

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    resolver = ImageResolver(tmp_path, 1000, folder=tmp_path / "cache")
    for url in ("ok.jpg\x00.png", "file:///ok%00.png", "a" * 5000, "~no-such-user-here/a.png",
                "loop"):  # fmt: skip
        with pytest.raises(ApiError) as e:
            resolver.resolve(url, "p")
        assert e.value.status == 400 and e.value.param == "p", url
        assert len(e.value.message) < 200, e.value.message


def test_cors_only_for_configured_origins(server, demo_model):
    r = httpx.get(server.root + "/health", headers={"Origin": "http://elsewhere.test"})
    assert "access-control-allow-origin" not in r.headers  # off by default
    from starlette.testclient import TestClient

    from merlin.engine.server.app import ServerConfig, create_app

    app = create_app(demo_model, ServerConfig(cors_origins=["http://ui.test"]))
    with TestClient(app) as tc:
        pre = {"Origin": "http://ui.test", "Access-Control-Request-Method": "POST"}
        r = tc.options("/v1/chat/completions", headers=pre)
        assert r.headers["access-control-allow-origin"] == "http://ui.test"
        r = tc.options("/v1/chat/completions", headers={**pre, "Origin": "http://evil.test"})
        assert r.headers.get("access-control-allow-origin") != "http://evil.test"
        # the headers the official JavaScript client sends with every request
        asked = "authorization,content-type,x-stainless-os,x-stainless-retry-count"
        r = tc.options(
            "/v1/chat/completions", headers={**pre, "Access-Control-Request-Headers": asked}
        )
        assert r.status_code == 200, r.text
        allowed = r.headers["access-control-allow-headers"].lower()
        assert all(h in allowed for h in asked.split(","))
        r = tc.get("/health", headers={"Origin": "http://ui.test"})
        assert "retry-after" in r.headers["access-control-expose-headers"].lower()


def test_a_client_that_leaves_a_whole_answer_cancels_it(server):
    before = server.health()["cancelled"]
    body = {**user("Go on and on."), "max_tokens": 8000, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/chat/completions", json=body, timeout=0.3)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.health()["cancelled"] == before:
        time.sleep(0.1)
    assert server.health()["cancelled"] == before + 1
    assert post(server, user("hi")).status_code == 200


def test_queue_bounds_waiting_jobs_and_skips_cancelled_ones():
    import asyncio
    import threading

    from merlin.engine.server.errors import ApiError
    from merlin.engine.server.queue import GenerationQueue

    release = threading.Event()
    ran = []

    def start(tag):
        def run(cancel):
            ran.append(tag)
            release.wait(10)
            yield tag

        return run

    async def main():
        q = GenerationQueue(max_waiting=1)
        a = q.submit(start("a"))
        while not q.busy:
            await asyncio.sleep(0.01)
        b = q.submit(start("b"))  # waits
        with pytest.raises(ApiError) as full:
            q.submit(start("c"))
        assert full.value.status == 429 and int(full.value.headers["Retry-After"]) >= 1
        b.cancel.set()  # its client left while it waited: its place is free at once
        assert q.waiting == 0
        d = q.submit(start("d"))
        release.set()
        assert await a.next() == ("event", "a") and await a.next() == ("end", None)
        kind, err = await b.next()  # skipped: an error, were its client still there
        assert kind == "error" and err.status == 503
        assert await d.next() == ("event", "d")
        q.close()

    asyncio.run(main())
    assert ran == ["a", "d"]


def test_an_image_path_that_is_no_file_says_what_it_is(tmp_path):
    import os

    from merlin.engine.server.errors import ApiError
    from merlin.engine.server.images import ImageResolver

    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "folder.png").mkdir()
    resolver = ImageResolver(tmp_path, 1000, folder=tmp_path / "cache")
    for url, says in (("pipe.png", "not a regular file"), ("folder.png", "not a regular file"),
                      ("missing.png", "no such file")):  # fmt: skip
        with pytest.raises(ApiError) as e:
            resolver.resolve(url, "p")
        assert e.value.status == 400 and says in e.value.message, e.value.message


def test_the_image_size_limit_is_told_in_the_unit_of_its_option(tmp_path):
    """--max-image-mb 20 is 20 MiB: the 413 says "up to 20.0 MB" (it said 21.0, in 10^6)."""
    from merlin.engine.server.images import ImageResolver

    resolver = ImageResolver(None, 20 << 20)
    try:
        text = resolver._too_big("messages[0].content[1].image_url", 22 << 20)
    finally:
        resolver.close()
    assert "the image is 22.0 MB" in text and "up to 20.0 MB" in text


def test_ctrl_c_ends_the_answers_in_progress_as_errors(demo_dir):
    """merlin-cli serve interrupted while a client streams: the client gets an error event at
    once (uvicorn's graceful shutdown had waited for the whole answer, which then ended as if
    finished), and the server exits."""
    import signal

    from merlin.engine.server.process import stream_interrupted

    s = ServerProcess("--model", str(demo_dir), "--context", "8192")
    try:
        lines, events = stream_interrupted(s.url, 7000, lambda: s.proc.send_signal(signal.SIGINT))
        assert s.proc.wait(30) is not None
    finally:
        s.stop()
    assert len(events) < 5000  # cut, not finished
    assert "not finished" in events[-1]["error"]["message"] and "data: [DONE]" not in lines


def test_data_urls_are_read_as_browsers_read_them(tmp_path):
    """Line-wrapped base64 (`base64`'s 76-character lines, MIME) and base64 without its "="
    padding are data: URLs browsers load; they were a 400 "not valid base64"."""
    import base64

    from merlin.engine.server.errors import ApiError
    from merlin.engine.server.images import ImageResolver

    data = bytes(range(256)) * 3 + b"12"  # 770 bytes: padded with "="
    plain = base64.b64encode(data).decode()
    resolver = ImageResolver(None, 1 << 20, folder=tmp_path / "cache")
    try:
        for payload in (plain, base64.encodebytes(data).decode(), plain.rstrip("="),
                        " \r\n".join(plain[i : i + 60] for i in range(0, len(plain), 60)),
                        plain.replace("+", "%2B")):  # fmt: skip
            path = resolver.resolve("data:image/png;base64," + payload, "p")
            assert path.read_bytes() == data, payload[:20]
        for bad in (plain[:-3] + "*", plain[:-4] + "A", "=" + plain, plain + "=="):
            with pytest.raises(ApiError) as e:
                resolver.resolve("data:image/png;base64," + bad, "p")
            assert e.value.status == 400 and "not valid base64" in e.value.message
    finally:
        resolver.close()


def test_the_size_limit_counts_the_image_not_its_wrapping(tmp_path):
    """An image just under the limit, line-wrapped or percent-escaped, had been refused as
    too big (its line breaks and escapes counted as data)."""
    import base64

    from merlin.engine.server.images import ImageResolver

    data = bytes(range(256)) * 115  # 29,440 bytes
    resolver = ImageResolver(None, 30_000, folder=tmp_path / "cache")
    try:
        wrapped = base64.encodebytes(data).decode().replace("\n", "\r\n")
        escaped = base64.b64encode(data).decode().replace("+", "%2B").replace("/", "%2F")
        for payload in (wrapped, escaped):
            assert resolver.resolve("data:image/png;base64," + payload, "p").read_bytes() == data
    finally:
        resolver.close()


def test_a_file_url_names_a_file_by_its_bytes(tmp_path):
    """file:///...bad%FFname.png is the file whose name has the byte 0xFF (a name that is
    not UTF-8): it had been read as U+FFFD, a name no file has."""
    import os

    from merlin.engine.server.images import ImageResolver

    name = os.fsdecode(b"bad\xffname.png")
    (tmp_path / name).write_bytes(b"picture")
    resolver = ImageResolver(tmp_path, 1000, folder=tmp_path / "cache")
    url = "file://" + str(tmp_path) + "/bad%FFname.png"
    assert resolver.resolve(url, "p") == tmp_path / name
