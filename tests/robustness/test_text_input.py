"""What people type and paste: every special-token string of the checkpoint stays plain text
(property tests over random mixes), invalid UTF-8 and lone surrogates are cleaned instead of
crashing the tokenizer, and a huge paste is refused at once with a message while the largest
accepted message still encodes quickly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unicodedata

import pytest
from fuzzutil import fuzz
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine.errors import InputError
from merlin.engine.generate import Finished
from merlin.engine.prompt import (
    MAX_MESSAGE_CHARS,
    build_prompt,
    chat_prompt_ids,
    check_user_text,
    sanitize_user_text,
)
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import Session
from merlin.engine.tokenizer import Tokenizer, clean_text


@pytest.fixture(scope="module")
def tok(demo_dir):
    return Tokenizer.from_folder(demo_dir)


def pieces(tok):
    """Fragments users produce: special strings whole and cut, their brackets, text, emoji."""
    specials = sorted(tok.special_tokens)
    cut = [s[: len(s) // 2] for s in specials] + [s[len(s) // 2 :] for s in specials]
    return st.one_of(
        st.sampled_from(specials),
        st.sampled_from(cut + ["<|", "|>", "<", ">", "|", "im_start", "\n", " ", "<<|", "|>>"]),
        st.text(max_size=6),
        st.sampled_from(["héllo", "日本語", "🙂", "e\u0301", "\u200b", "\r\n", "\t", "\x00"]),
    )


def user_texts(tok):
    return st.lists(pieces(tok), min_size=1, max_size=12).map("".join)


def nfc(s: str) -> str:
    return unicodedata.normalize("NFC", s)  # the demo tokenizer's normalizer


@fuzz(400)
@given(data=st.data())
def test_special_strings_typed_by_a_user_are_plain_text(tok, data):
    text = data.draw(user_texts(tok))
    specials = set(tok.special_tokens.values())
    ids = tok.encode_text(text)
    assert not specials & set(ids), text
    assert tok.decode(ids) == nfc(text)


@fuzz(300)
@given(data=st.data())
def test_chat_control_tokens_come_only_from_the_template(tok, data):
    """Whatever the user, system or earlier assistant turns contain, the control tokens of the
    encoded chat are exactly the template's (the same as for neutral text), and the ids decode
    back to the rendered conversation."""
    texts = [data.draw(user_texts(tok)).strip() or "x" for _ in range(3)]

    def chat(a, b, c):
        return [
            {"role": "system", "content": a},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": b}]},
            {"role": "assistant", "content": c},
            {"role": "user", "content": b},
        ]

    specials = set(tok.special_tokens.values())
    ids = tok.encode_chat(chat(*texts))
    neutral = tok.encode_chat(chat("x", "x", "x"))
    assert [i for i in ids if i in specials] == [i for i in neutral if i in specials]
    assert tok.decode(ids) == nfc(tok.render_chat(chat(*texts)))


def test_every_special_string_alone_and_glued(tok):
    specials = tok.special_tokens
    ids_of = set(specials.values())
    template_only = [i for i in chat_prompt_ids(tok, "x") if i in ids_of]
    everything = "".join(specials)
    for text in [*specials, everything, " ".join(specials), everything * 3]:
        assert not ids_of & set(tok.encode_text(text)), text
        assert [i for i in chat_prompt_ids(tok, text) if i in ids_of] == template_only, text


# ---- broken text from the clipboard --------------------------------------------------------


@pytest.mark.parametrize(
    "raw,expected",
    [
        (b"caf\xc3\xa9", "café"),
        (b"caf\xe9", "caf\ufffd"),  # latin-1 byte: invalid UTF-8
        (b"\xff\xfe\x00", "\ufffd\ufffd\x00"),
        (b"\xf0\x9f\x99", "\ufffd"),  # a cut emoji
        (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),  # an encoded surrogate is not UTF-8
        ("a\udc80b", "a\ufffdb"),  # surrogateescape leftover
        ("\ud83d", "\ufffd"),  # lone high surrogate
        ("x\udfff", "x\ufffd"),
        ("\ud83d\ude00", "😀"),  # a UTF-16 pair stored as two code points
        ("plain <|im_start|>", "plain <|im_start|>"),
    ],
)
def test_sanitize_user_text(raw, expected):
    assert sanitize_user_text(raw) == expected


def test_clean_text_keeps_ordinary_text_as_is():
    s = "ordinary text 🙂 <|im_end|>"
    assert clean_text(s) is s


SURROGATES = st.characters(categories=["Cs"])


@fuzz(300)
@given(text=st.lists(st.one_of(st.characters(), SURROGATES), max_size=40).map("".join))
def test_any_python_string_encodes(tok, text):
    """Any str (lone surrogates included) encodes; it used to raise TypeError from tokenizers."""
    cleaned = clean_text(text)
    if any("\ud800" <= c <= "\udfff" for c in text):
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")
    cleaned.encode("utf-8")  # always valid UTF-8 afterwards
    assert tok.encode_text(text) == tok.encode_text(cleaned)
    if text.strip():
        assert tok.encode_chat([{"role": "user", "content": text}]) == tok.encode_chat(
            [{"role": "user", "content": cleaned}]
        )


def test_surrogates_through_the_prompt_builders(demo_model):
    tok, cfg = demo_model.tokenizer, demo_model.config
    bad = "look \ud83d\ude00 and \udc80 here"
    ids = chat_prompt_ids(tok, bad)
    assert ids == chat_prompt_ids(tok, "look 😀 and \ufffd here")
    assert build_prompt(tok, cfg, bad).ids == ids


# ---- huge pastes ---------------------------------------------------------------------------


def test_a_1_mb_paste_is_refused_at_once(tok, demo_model):
    paste = ("lorem ipsum dolor sit amet " * 40_000)[:1_000_000]
    for call in (
        lambda: chat_prompt_ids(tok, paste),
        lambda: build_prompt(tok, demo_model.config, paste),
        lambda: check_user_text(paste.encode()),
    ):
        t0 = time.perf_counter()
        with pytest.raises(InputError) as e:
            call()
        assert time.perf_counter() - t0 < 0.1  # refused before tokenizing
        msg = str(e.value)
        assert "1,000,000 characters" in msg and f"{MAX_MESSAGE_CHARS:,}" in msg


GREEDY = dict(sampling=SamplingParams(temperature=0.0), max_new_tokens=3, ignore_eos=True)


def test_a_1_mb_paste_in_a_session_is_refused_and_the_chat_goes_on(demo_model):
    """merlin.engine.session checks every user turn (ask, edit, respond): refused before any work,
    the conversation and its cache unchanged, the next turn answered as usual."""
    paste = "x" * 1_000_000
    session = Session(demo_model)
    list(session.ask("Hello?", **GREEDY))
    before = ([m.key() for m in session.messages], session.token_ids, session.cached_tokens)
    for call in (
        lambda: session.ask(paste, **GREEDY),
        lambda: session.edit(0, paste, **GREEDY),
        lambda: session.respond([*session.messages, {"role": "user", "text": paste}]),
    ):
        t0 = time.perf_counter()
        with pytest.raises(InputError, match="1,000,000 characters"):
            call()
        assert time.perf_counter() - t0 < 0.1
    assert ([m.key() for m in session.messages], session.token_ids, session.cached_tokens) == (
        before
    )
    assert isinstance(list(session.ask("And now?", **GREEDY))[-1], Finished)
    # lone surrogates (a broken clipboard) are cleaned on the way in
    list(session.ask("broken \udc80 clipboard", **GREEDY))
    assert session.messages[-2].text == "broken \ufffd clipboard"


def test_a_1_mb_paste_in_the_headless_chat(demo_dir):
    """merlin-cli chat: one clear line for the refused turn, the next turn answered, exit 2."""
    stdin = "x" * 1_000_000 + "\nHello?\n"
    r = subprocess.run(
        [sys.executable, "-m", "merlin.engine.cli", "chat", "--model", str(demo_dir), "--json"]
        + ["--temperature", "0", "--max-new-tokens", "3", "--ignore-eos"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "1,000,000 characters" in errors[0], r.stderr
    assert f"{MAX_MESSAGE_CHARS:,}" in errors[0]
    assert r.stdout.count('"event": "finished"') == 1


def test_bytes_that_are_not_utf8_in_the_headless_chat(demo_dir, tmp_path):
    """merlin-cli chat under a UTF-8 locale, stdin holding a byte that is not UTF-8: the turn
    is answered with U+FFFD in its place (it was a UnicodeDecodeError traceback that lost
    the whole conversation), and a picture path's own bytes still name the file."""
    from PIL import Image

    picture = os.fsencode(tmp_path) + b"/caf\xe9.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(os.fsdecode(picture))
    stdin = b"first line\nhi \xff\xfe there\n/image " + picture + b"\nwhat is it?\n"
    r = subprocess.run(
        [sys.executable, "-m", "merlin.engine.cli", "chat", "--model", str(demo_dir), "--json"]
        + ["--temperature", "0", "--max-new-tokens", "2", "--ignore-eos"],
        input=stdin,
        capture_output=True,
        timeout=300,
        env=dict(os.environ, PYTHONIOENCODING="utf-8", LC_ALL="C.UTF-8"),
    )
    stderr = r.stderr.decode(errors="replace")
    assert r.returncode == 0 and "Traceback" not in stderr, stderr
    assert r.stdout.count(b'"event": "finished"') == 3, stderr


def test_the_limit_is_inclusive(tok):
    assert check_user_text("a" * MAX_MESSAGE_CHARS) == "a" * MAX_MESSAGE_CHARS
    with pytest.raises(InputError):
        check_user_text("a" * (MAX_MESSAGE_CHARS + 1))


WORST_TEXTS = {
    "one long word": lambda n: "a" * n,
    "digits": lambda n: ("31415926535897932384626433832795" * (n // 32 + 1))[:n],
    "emoji": lambda n: "🙂" * n,
    "cjk": lambda n: "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(n)),
    "mixed unicode": lambda n: "".join(chr(32 + (i * 104729) % 0x2FD0) for i in range(n)),
    "special strings": lambda n: ("<|im_start|><think>" * (n // 19 + 1))[:n],
    "punctuation": lambda n: ("!?.,;:-_()[]{}<>|" * (n // 17 + 1))[:n],
}


@pytest.mark.parametrize("kind", sorted(WORST_TEXTS))
def test_largest_accepted_message_encodes_quickly(tok, kind, record_property):
    """The biggest message that is accepted turns into a prompt within a couple of seconds on
    the CI machine (about 1 s at worst on the dev box: docs/robustness.md)."""
    text = WORST_TEXTS[kind](MAX_MESSAGE_CHARS)
    assert len(text) == MAX_MESSAGE_CHARS
    t0 = time.perf_counter()
    ids = chat_prompt_ids(tok, text)
    seconds = time.perf_counter() - t0
    record_property("seconds", round(seconds, 3))
    print(f"{kind}: {len(ids)} tokens in {seconds:.2f} s")
    assert seconds < 3.0
