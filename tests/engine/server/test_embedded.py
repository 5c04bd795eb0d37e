"""The API served from inside a program that holds the model (the app's "serve" switch):
answers equal to the in-process generation, requests wait while the host computes (the
shared engine lock), the key policy beyond loopback, a port in use, and stop() frees the port."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from merlin.engine.errors import MerlinError
from merlin.engine.generate import AnswerOptions, Tokens, generate
from merlin.engine.prompt import build_prompt
from merlin.engine.sampling import SamplingParams
from merlin.engine.server.embedded import EmbeddedServer, ServeOptions


@pytest.fixture
def served(demo_model):
    lock = threading.Lock()
    server = EmbeddedServer.start(demo_model, ServeOptions(port=0, context=2048), lock)
    yield server, lock
    server.stop()


def _ask(url: str, text: str, key: str = "unused", max_tokens: int = 6) -> str:
    c = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)
    r = c.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return r.choices[0].message.content


def test_answers_equal_the_in_process_generation(served, demo_model):
    server, _ = served
    assert server.url.startswith("http://127.0.0.1:") and server.api_key is None
    got = _ask(server.url, "Hello there")
    prompt = build_prompt(demo_model.tokenizer, demo_model.config, "Hello there")
    options = AnswerOptions(sampling=SamplingParams(temperature=0.0), max_new_tokens=6)
    want = "".join(e.text for e in generate(demo_model, prompt, options) if isinstance(e, Tokens))
    assert got == want


def test_a_request_waits_while_the_host_computes(served):
    server, lock = served
    answers = []
    with lock:  # the host (the app) is answering its own question
        t = threading.Thread(target=lambda: answers.append(_ask(server.url, "Hi")))
        t.start()
        time.sleep(1.0)
        assert not answers  # queued behind the host's forward, not run beside it
        health = httpx.get(server.url[: -len("/v1")] + "/health", timeout=10).json()
        assert health  # the server itself stays responsive
    t.join(120)
    assert answers and isinstance(answers[0], str)


def test_stop_frees_the_port_and_a_port_in_use_is_an_error(demo_model):
    lock = threading.Lock()
    first = EmbeddedServer.start(demo_model, ServeOptions(port=0), lock)
    port = int(first.url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(MerlinError, match="cannot listen"):
        EmbeddedServer.start(demo_model, ServeOptions(port=port), lock)
    first.stop()
    assert not first.running
    again = EmbeddedServer.start(demo_model, ServeOptions(port=port), lock)
    assert again.url == first.url
    again.stop()


def test_beyond_loopback_a_key_is_generated_and_required(demo_model):
    server = EmbeddedServer.start(
        demo_model, ServeOptions(host="0.0.0.0", port=0), threading.Lock()
    )
    try:
        assert server.api_key and len(server.api_key) >= 24
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        url = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(openai.AuthenticationError):
            _ask(url, "Hi", key="wrong")
        assert isinstance(_ask(url, "Hi", key=server.api_key), str)
    finally:
        server.stop()


def test_a_bad_port_is_refused(demo_model):
    with pytest.raises(MerlinError, match="not a port"):
        EmbeddedServer.start(demo_model, ServeOptions(port=70000), threading.Lock())


def test_an_answer_cut_by_stopping_the_server_is_an_error_to_its_client(demo_model, monkeypatch):
    """Serve turned off while a client streams: the client gets an error event, not a
    finish_reason "stop" and [DONE] that made the cut answer look whole."""
    import merlin.engine.generate as generate_mod
    from merlin.engine.server.process import stream_interrupted

    real = generate_mod.decode_step

    def slow(*args, **kwargs):  # an answer long enough to be cut
        time.sleep(0.01)
        return real(*args, **kwargs)

    monkeypatch.setattr(generate_mod, "decode_step", slow)
    server = EmbeddedServer.start(demo_model, ServeOptions(port=0, context=4096), threading.Lock())
    stopping = threading.Thread(target=server.stop)
    lines, events = stream_interrupted(server.url, 3000, stopping.start)
    stopping.join(30)
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", [])]
    assert len(events) < 1000  # cut
    assert "stop" not in finishes and "length" not in finishes and "data: [DONE]" not in lines
    assert "not finished" in events[-1]["error"]["message"]
