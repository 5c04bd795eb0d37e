"""The app's remote mode against llama.cpp's own OpenAI-compatible server (llama-cpp-python's
`llama_cpp.server`), driven through the window offscreen: the shipped demo model's text
decoder written as GGUF (engine/bench/gguf_export.py, with its chat template), served by
llama.cpp, answers a text question with the same words as Merlin's own engine; a follow-up
and Stop work as with any server.

Marked `peer`: not part of the default suite (it needs llama.cpp built from PyPI, 5-10
minutes on 2 cores, once). Run it with `scripts/test-peer.sh`, which builds llama.cpp into its
own venv (engine/bench/peer.py) if it is not there and runs `pytest -m peer`."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401

from merlin.app.model.remote import REMOTE_SOURCE

pytestmark = pytest.mark.peer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(shapes_dir, tmp_path_factory):
    from merlin.engine.bench import peer

    peer.ensure_llama_cpp()
    gguf = tmp_path_factory.mktemp("gguf") / "demo-f32.gguf"
    python = str(peer.venv_python())
    subprocess.run(
        [python, str(peer.HERE / "gguf_export.py"), str(shapes_dir), str(gguf), "f32"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    port = _free_port()
    log = open(tmp_path_factory.mktemp("log") / "llama-server.log", "w")
    proc = subprocess.Popen(
        [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "4096"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as r:
                model_id = json.loads(r.read())["data"][0]["id"]
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"llama.cpp's server did not start; see {log.name}")
            time.sleep(0.5)
    yield url, model_id
    proc.terminate()
    proc.wait(20)
    log.close()


def _merlin_answer(folder, question: str, max_new_tokens: int) -> str:
    from merlin.engine.generate import Tokens
    from merlin.engine.model import load_model
    from merlin.engine.session import Session

    session = Session(load_model(folder, weights="f32", kv="f32"))
    events = session.ask(question, max_new_tokens=max_new_tokens, spec="off")
    return "".join(e.text for e in events if isinstance(e, Tokens))


def test_gui_answers_through_llama_cpp_server(qtbot, make_window, llama_server, shapes_dir):
    url, model_id = llama_server
    window = make_window(
        model=REMOTE_SOURCE, remote_url=url, remote_model=model_id,
        use_model_sampling=False, temperature=0.0, max_new_tokens=60,
    )  # fmt: skip
    c = window.controller
    assert c.model is not None and c.model.source == REMOTE_SOURCE
    question = "Hello, who are you?"
    send(qtbot, window, question)
    rows = window.store.messages(c.current_id)
    assert rows[-1].role == "assistant" and rows[-1].state == "done", rows[-1]
    # the same greedy words as Merlin's engine on the same checkpoint (the demo model's
    # honest sentence for a text-only question)
    assert rows[-1].text.strip() == _merlin_answer(shapes_dir, question, 60).strip()
    assert rows[-1].stats["tokens"] > 0 and window.stats.prefill_tokens > 0
    send(qtbot, window, "And what can you do?")  # a follow-up through the same server
    rows = window.store.messages(c.current_id)
    assert len(rows) == 4 and rows[-1].state == "done" and rows[-1].text.strip()
