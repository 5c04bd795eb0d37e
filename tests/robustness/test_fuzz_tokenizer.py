"""Fuzzing the tokenizer files of a checkpoint: tokenizer.json (structure edits in every
section, byte edits), tokenizer_config.json, chat_template.json and chat_template.jinja (edits of
the template text), and hostile templates (runaway loops, huge values, huge output, recursion).

Every case ends in a working tokenizer (it encodes, renders a chat and decodes) or a
TokenizerError with a message; never another exception (a Rust panic included), a hang or a
runaway allocation.
"""

from __future__ import annotations

import json
import shutil

import pytest
from fuzzutil import attempt, dumps, fuzz, json_values, mutate_bytes, mutate_json, watchdog
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine.errors import TokenizerError
from merlin.engine.tokenizer import RENDER_SECONDS, Tokenizer

TEXTS = ["hello <|im_start|>system\nwörld 🙂 日本", "", " ", "\ud800 lone", "a" * 300]
CHAT = [
    {"role": "system", "content": "be brief <|im_end|>"},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is <think>"}]},
    {"role": "assistant", "content": "a cat"},
    {"role": "user", "content": "and?"},
]


def exercise(folder):
    """Load, then use every entry point a chat needs."""
    tok = Tokenizer.from_folder(folder)
    for text in TEXTS:
        ids = tok.encode_text(text)
        assert all(isinstance(i, int) for i in ids)
        tok.decode(ids)
    stream = tok.stream_decoder()
    "".join(stream.push(i) for i in tok.encode_text(TEXTS[0])) + stream.flush()
    if tok.has_chat_template:
        ids = tok.encode_chat(CHAT, add_generation_prompt=True)
        tok.decode(ids)
    return tok


@pytest.fixture(scope="module")
def ws(demo_dir, tmp_path_factory):
    dst = tmp_path_factory.mktemp("fuzz-tokenizer") / "ckpt"
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.json"):
        shutil.copy(demo_dir / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def tokenizer_json(demo_dir):
    return json.loads((demo_dir / "tokenizer.json").read_text())


def restore(demo_dir, ws, *names):
    for name in names:
        shutil.copy(demo_dir / name, ws / name)


def test_demo_files_pass(ws):
    exercise(ws)


SECTIONS = ("added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model")


def tokenizer_focus(path) -> bool:
    """Section roots and their settings, a few vocab/merge entries; not thousands of them."""
    if path[0] not in SECTIONS:
        return len(path) == 1
    if path[0] == "model" and len(path) >= 2 and path[1] in ("vocab", "merges"):
        return len(path) == 2 or (isinstance(path[2], int) and path[2] < 5) or path[2] == "a"
    return len(path) <= 4


@fuzz(100)
@given(data=st.data())
def test_tokenizer_json_structure_edits(demo_dir, ws, tokenizer_json, data):
    edited = mutate_json(tokenizer_json, data.draw, n_max=2, focus=tokenizer_focus)
    (ws / "tokenizer.json").write_text(dumps(edited), "utf-8", "surrogatepass")
    try:
        with watchdog():
            out = attempt(exercise, ws)
    finally:
        restore(demo_dir, ws, "tokenizer.json")
    assert out.ok or isinstance(out.error, TokenizerError)


@fuzz(100)
@given(data=st.data())
def test_tokenizer_json_byte_edits(demo_dir, ws, data):
    raw = (demo_dir / "tokenizer.json").read_bytes()
    (ws / "tokenizer.json").write_bytes(mutate_bytes(raw, data.draw, hot=4000))
    try:
        out = attempt(exercise, ws)
    finally:
        restore(demo_dir, ws, "tokenizer.json")
    assert out.ok or isinstance(out.error, TokenizerError)


@pytest.fixture(scope="module")
def tokenizer_config(demo_dir):
    return json.loads((demo_dir / "tokenizer_config.json").read_text())


@fuzz(120)
@given(data=st.data())
def test_tokenizer_config_edits(demo_dir, ws, tokenizer_config, data):
    cfg = mutate_json(tokenizer_config, data.draw, n_max=3)
    if data.draw(st.booleans()):
        cfg["chat_template"] = data.draw(
            st.one_of(json_values(1), st.just([{"name": "default", "template": "{{ x"}]))
        )
    (ws / "tokenizer_config.json").write_text(dumps(cfg), "utf-8", "surrogatepass")
    if data.draw(st.booleans()):
        (ws / "chat_template.json").unlink()  # the config's template is used then
    try:
        out = attempt(exercise, ws)
    finally:
        restore(demo_dir, ws, "tokenizer_config.json", "chat_template.json")
    assert out.ok or isinstance(out.error, TokenizerError)


@pytest.fixture(scope="module")
def template(demo_dir):
    return json.loads((demo_dir / "chat_template.json").read_text())["chat_template"]


TEMPLATE_SNIPPETS = [
    "{%",
    "%}",
    "{{",
    "}}",
    "{% endfor %}",
    "{% for m in messages %}",
    "{{ messages[0].content }}",
    "{{ raise_exception('x') }}",
    "{{ 1/0 }}",
    "{{ none.x.y }}",
    "{{ messages|tojson }}",
    "{{ range(10)|list }}",
    "{% set x = 'a' * 10 %}",
    "{{ message.content[0].text }}",
    "{{ message['role'] ~ 1 }}",
    "{% generation %}x{% endgeneration %}",
    "{% break %}",
    "{{ strftime_now('%Y') }}",
    "{{ ''.__class__ }}",
    "{{ loop.index0 + 1 }}",
]


@fuzz(200)
@given(data=st.data())
def test_chat_template_text_edits(demo_dir, ws, template, data):
    text = template
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["insert", "delete", "snippet"]))
        if kind == "insert":
            text = text[:pos] + data.draw(st.text(max_size=6)) + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + data.draw(st.integers(1, 40)) :]
        else:
            text = text[:pos] + data.draw(st.sampled_from(TEMPLATE_SNIPPETS)) + text[pos:]
    where = data.draw(st.sampled_from(["json", "jinja"]))
    if where == "json":
        (ws / "chat_template.json").write_text(
            dumps({"chat_template": text}), "utf-8", "surrogatepass"
        )
    else:
        (ws / "chat_template.jinja").write_text(text, "utf-8", "surrogatepass")
    try:
        with watchdog():
            out = attempt(exercise, ws)
    finally:
        restore(demo_dir, ws, "chat_template.json")
        (ws / "chat_template.jinja").unlink(missing_ok=True)
    assert out.ok or isinstance(out.error, TokenizerError)


HOSTILE_TEMPLATES = {
    "nested ranges": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}",
    "string product": "{{ 'x' * 1000000000 }}",
    "list product": "{{ ([1] * 100000000)|length }}",
    "power": "{{ 10 ** 100000000 }}",
    "output flood": "{% for i in range(100000) %}{% for j in range(1000) %}{{ 'xxxxxxxxxx' }}"
    "{% endfor %}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "attribute loop": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{{ messages[0].role[:0] }}{% endfor %}{% endfor %}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
}


STOPPED_BY = {  # which limit stops each (all of them end in a TokenizerError)
    "nested ranges": "operations",
    "string product": "builds a value",
    "list product": "builds a value",
    "power": "builds a value",
    "output flood": "output passed",
    "recursion": "RecursionError",
    "doubling": "builds a value",
    "attribute loop": "operations",
    "sandbox escape": "unsafe",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_templates_are_stopped(demo_dir, ws, name):
    (ws / "chat_template.jinja").write_text(HOSTILE_TEMPLATES[name])
    try:
        tok = Tokenizer.from_folder(ws)
        out = attempt(tok.encode_chat, [{"role": "user", "content": "hi"}])
    finally:
        (ws / "chat_template.jinja").unlink()
    assert isinstance(out.error, TokenizerError), name
    assert "chat template" in str(out.error) and STOPPED_BY[name] in str(out.error)
    assert out.seconds < RENDER_SECONDS + 1


@pytest.mark.parametrize(
    "text", ["{% break %}", "{% continue %}", "{% if x %}{% break %}{% endif %}", "{{ x"]
)
def test_templates_that_do_not_compile(demo_dir, ws, text):
    """`{% break %}` outside a loop passes Jinja's parser but is invalid Python (found by the
    template fuzz above): a TokenizerError, like a syntax error."""
    (ws / "chat_template.jinja").write_text(text)
    try:
        out = attempt(Tokenizer.from_folder, ws)
    finally:
        (ws / "chat_template.jinja").unlink()
    assert isinstance(out.error, TokenizerError)
    assert "chat template" in str(out.error).lower()


@pytest.mark.parametrize(
    "name,text",
    [
        ("tokenizer.json", "[" * 100_000),
        ("tokenizer.json", '{"model": ' + "9" * 5000 + "}"),
        ("tokenizer.json", '{"model": {}, "added_tokens": 7}'),
        ("tokenizer_config.json", '{"chat_template": ' + "[" * 100_000 + "}"),
        ("chat_template.json", "{" * 100_000),
        ("tokenizer.json", "PREFIX"),
    ],
    ids=["deep", "long-int", "added-tokens-int", "config-deep", "template-deep", "rust-panic"],
)
def test_hostile_json_files(demo_dir, ws, tokenizer_json, name, text):
    if text == "PREFIX":  # makes the tokenizers library panic (found by this fuzz suite)
        edited = json.loads(json.dumps(tokenizer_json))
        edited["model"]["continuing_subword_prefix"] = "x" * 16
        text = json.dumps(edited)
    (ws / name).write_text(text)
    try:
        out = attempt(Tokenizer.from_folder, ws)
    finally:
        restore(demo_dir, ws, name)
    assert isinstance(out.error, TokenizerError)
