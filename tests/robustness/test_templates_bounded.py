"""The chat-template sandbox bounds the memory of intermediates (engine.template_limits), not
only the output: every hostile template below ends in a TokenizerError within seconds and a
small peak allocation; a template's own error message is bounded; an added token with empty
content changes nothing."""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc

import pytest
from fuzzutil import fuzz, traced
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine.errors import TokenizerError
from merlin.engine.tokenizer import Tokenizer

HOSTILE = [
    "{{ lipsum(100000) }}",
    '{{ "x"|center(1000000000) }}',
    '{{ "a"|indent(1000000000) }}',
    '{{ "a b"|wordwrap(1000000000) }}',
    '{{ "%1000000000d" % 1 }}',
    '{{ "%s" % ((["x" * 100000]) * 100,) }}',
    '{{ "{:>1000000000}".format(1) }}',
    '{{ "x".ljust(1000000000) }}',
    '{{ ("x" * 1000000).replace("x", "yyyyyyyy") }}',
    '{{ (["x" * 1000000] * 1000)|join }}',
    '{{ (["ab"] * 1000)|join|join("z" * 1000000) }}',
    '{{ range(100000)|join("z" * 100000) }}',
    '{{ ("ab" * 100000)|replace("ab", "y" * 1000000) }}',
    '{{ ("ab" * 10000)|replace("", "y" * 100000) }}',
    '{{ ("\\n" * 100000)|indent(100000) }}',
    '{{ (["x" * 1000000] * 100)|string }}',
    '{{ (["ab"] * 1000000)|tojson }}',
    '{% set ns = namespace(x="xx") %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}'
    "{% endfor %}{{ ns.x|length }}",
    "{% macro m(x, n) %}{% if n %}{{ m(x ~ x, n - 1) }}{% else %}{{ x }}{% endif %}"
    '{% endmacro %}{{ m("ab", 40) }}',
    '{% set x %}{% for i in range(100000) %}{{ "y" * 1000 }}{% endfor %}{% endset %}{{ x|length }}',
    '{% set l = [] %}{% for i in range(1000) %}{% set l = l + ["x" * 100000 ~ i] %}'
    "{% endfor %}{{ l|length }}",
]


def _tokenizer_with(demo_dir, tmp_path, template: str) -> Tokenizer:
    folder = tmp_path / "tok"
    shutil.copytree(demo_dir, folder)
    for p in folder.glob("chat_template*"):
        p.unlink()
    (folder / "chat_template.jinja").write_text(template)
    return Tokenizer.from_folder(folder)


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_template_bounded(demo_dir, tmp_path, template):
    t0 = time.perf_counter()
    tok = _tokenizer_with(demo_dir, tmp_path, template)  # nothing runs at compile time
    assert time.perf_counter() - t0 < 15
    with traced():
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        with pytest.raises(TokenizerError):
            tok.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        peak = tracemalloc.get_traced_memory()[1] - base
    assert time.perf_counter() - t0 < 15
    assert peak < 100 << 20, f"{peak / 1e6:.0f} MB"


FILTERS = ["center", "indent", "wordwrap", "truncate", "batch", "slice", "join", "replace"]


@fuzz(30)
@given(
    name=st.sampled_from(FILTERS),
    n=st.sampled_from([1, 10, 10**6, 10**9, 10**18, -(10**9)]),
    reps=st.sampled_from([1, 1000, 100000]),
)
def test_generated_filter_calls_bounded(name, n, reps):
    """The tokenizer's own sandbox and render path (engine.chat_template.make_jinja_env)."""
    from merlin.engine.chat_template import make_jinja_env as _make_jinja_env

    args = {"replace": f'("ab", "y" * {n % 10**7})', "join": f'("z" * {n % 10**7})'}.get(
        name, f"({n})"
    )
    template = f'{{{{ (["ab"] * {reps})|join|{name}{args} }}}}'
    env = _make_jinja_env()
    compiled = env.from_string(template)
    with traced():
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        try:
            env.render_budgeted(compiled, 2_000_000, {})
        except Exception:  # noqa: BLE001, S110 - the tokenizer turns any into a TokenizerError
            pass
        peak = tracemalloc.get_traced_memory()[1] - base
    assert time.perf_counter() - t0 < 60  # generous: tracemalloc slows the loops
    assert peak < 100 << 20, f"{peak / 1e6:.0f} MB"


def test_raise_exception_message_is_bounded(demo_dir, tmp_path):
    tok = _tokenizer_with(
        demo_dir, tmp_path, '{{ raise_exception("x" * 1000 ~ ("y" * 1000) * 8000) }}'
    )
    with pytest.raises(TokenizerError) as e:
        tok.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert len(str(e.value)) < 5000


def test_empty_template_output_is_an_error(demo_dir, tmp_path):
    tok = _tokenizer_with(demo_dir, tmp_path, "{% if false %}x{% endif %}")
    with pytest.raises(TokenizerError, match="renders nothing"):
        tok.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)


def test_added_token_with_empty_content(demo_dir, tmp_path):
    good = Tokenizer.from_folder(demo_dir)
    folder = tmp_path / "tok"
    shutil.copytree(demo_dir, folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    top = max(t["id"] for t in data["added_tokens"]) + 1
    data["added_tokens"].append({"id": top, "content": "", "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(data))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.get("added_tokens_decoder", {})[str(top)] = {"content": "", "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    try:
        tok = Tokenizer.from_folder(folder)
    except TokenizerError:
        return  # refusing the file is fine too
    msgs = [{"role": "user", "content": "hello world, a longer sentence"}]
    assert tok.encode_chat(msgs, add_generation_prompt=True) == good.encode_chat(
        msgs, add_generation_prompt=True
    )
