"""The OpenAI-compatible server with a thinking model (a copy of the random demo checkpoint
with a Thinking-style template): the reasoning comes back as `reasoning_content` (whole and
streamed), apart from `content`, equal to merlin-cli generate's; an assistant message's
`reasoning_content` is accepted on the way in."""

from __future__ import annotations

import json

import httpx
import pytest
from support import run_cli
from thinking_fixtures import THINKING_TEMPLATE, checkpoint_with_template

from merlin.engine.server.process import ServerProcess


@pytest.fixture(scope="module")
def think_dir(demo_dir, tmp_path_factory):
    return checkpoint_with_template(demo_dir, tmp_path_factory.mktemp("t") / "t", THINKING_TEMPLATE)


@pytest.fixture(scope="module")
def server(think_dir):
    s = ServerProcess("--model", str(think_dir))
    yield s
    s.stop()


def _body(messages, **kw):
    return {"model": "m", "messages": messages, "temperature": 0, "max_tokens": 12,
            "ignore_eos": True, **kw}  # fmt: skip


def test_reasoning_content_whole_and_streamed(server, think_dir):
    r = run_cli(
        "generate", "--model", str(think_dir), "hi", "--temperature", "0",
        "--max-new-tokens", "12", "--ignore-eos", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout.splitlines()[-1])
    assert cli["reasoning"]  # a random model never closes the block: all reasoning
    url = server.url.rstrip("/") + "/chat/completions"
    whole = httpx.post(url, json=_body([{"role": "user", "content": "hi"}]), timeout=120)
    assert whole.status_code == 200, whole.text
    msg = whole.json()["choices"][0]["message"]
    assert msg["reasoning_content"] == cli["reasoning"] and msg["content"] == cli["text"]
    body = _body([{"role": "user", "content": "hi"}], stream=True)
    reasoning, content = [], []
    with httpx.stream("POST", url, json=body, timeout=120) as s:
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                reasoning.append(choice["delta"].get("reasoning_content") or "")
                content.append(choice["delta"].get("content") or "")
    assert "".join(reasoning) == cli["reasoning"] and "".join(content) == cli["text"]
    # the conversation sent back with the reasoning: accepted
    follow = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "They greet me."},
        {"role": "user", "content": "again"},
    ]
    r2 = httpx.post(url, json=_body(follow), timeout=120)
    assert r2.status_code == 200, r2.text
    bad = [{"role": "user", "content": "hi", "reasoning_content": 3}]
    r3 = httpx.post(url, json=_body(bad), timeout=120)
    assert r3.status_code == 400 and "reasoning_content" in r3.text


def test_the_apps_remote_engine_gets_reasoning_apart(server, think_dir):
    """The app's remote backend (app/model/remote.py) marks the server's reasoning_content
    deltas as reasoning, so a remote thinking model's reasoning shows in its block."""
    from merlin.app.model.prompting import GenerationOptions, Turn
    from merlin.app.model.remote import RemoteBackend, RemoteConfig, list_models
    from merlin.engine.generate import Tokens

    model = list_models(RemoteConfig(server.url))[0]
    options = GenerationOptions(sampling={"temperature": 0.0}, max_new_tokens=8, spec_mode="off")
    events = list(RemoteBackend(RemoteConfig(server.url, model=model)).respond(
        [Turn("user", "hi")], options, None
    ))  # fmt: skip
    tokens = [e for e in events if isinstance(e, Tokens)]
    assert any(e.reasoning for e in tokens)
    assert all(e.reasoning_ids == (1 if e.reasoning else 0) for e in tokens)
    assert "".join(e.text for e in tokens) == ""  # a random model never closes the block
