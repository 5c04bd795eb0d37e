"""Answers keep the token ids they were generated as, and the next prompt reuses them.

Models emit non-canonical tokenizations (a word as several pieces where the tokenizer would
use one token). The KV cache holds those ids; a prompt that re-encoded the answer's text would
differ from the cache inside the answer, and the follow-up would recompute everything after
that point. These tests force such an answer (the sampler is scripted to emit one token per
character of a word the tokenizer encodes as fewer tokens) and check that the follow-up
recomputes only the new turn: in memory, after the app sends the conversation as text, after
save and restore, and in `merlin-cli chat --session`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import merlin.engine.generate as generate_mod
from merlin.engine.generate import Finished, PrefillDone
from merlin.engine.prompt import build_prompt
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import SESSION_FORMAT, Message, Session, persistence

GREEDY = SamplingParams(temperature=0.0)
GEN = dict(sampling=GREEDY, max_new_tokens=4, ignore_eos=True, spec="off")


def non_canonical(tok) -> tuple[str, list[int]]:
    """(text, ids): one token per character, while the tokenizer encodes the text shorter."""
    for text in ("hello world", "the answer is yes", "function", "lighthouse keeper"):
        ids = [tok.encode_text(c)[0] for c in text]
        if all(len(tok.encode_text(c)) == 1 for c in text) and tok.decode(ids) == text:
            if tok.encode_text(text) != ids:
                return text, ids
    raise AssertionError("no word the demo tokenizer merges; pick another candidate")


def scripted(monkeypatch, ids):
    """The sampler emits `ids` in order, whatever the logits."""
    it = iter(ids)
    monkeypatch.setattr(generate_mod.Sampler, "sample", lambda self, logits, history=(): next(it))


def first(events, kind):
    return next(e for e in events if isinstance(e, kind))


def forced_answer(model, monkeypatch, session: Session) -> tuple[str, list[int]]:
    text, ids = non_canonical(model.tokenizer)
    with monkeypatch.context() as m:
        scripted(m, ids)
        events = list(session.ask("Say it.", **dict(GEN, max_new_tokens=len(ids))))
    done = events[-1]
    assert isinstance(done, Finished) and done.token_ids == ids and done.text == text
    assert session.messages[-1] == Message("assistant", text, [], ids)
    return text, ids


def test_the_template_keeps_the_answer_ids(demo_model):
    tok, cfg = demo_model.tokenizer, demo_model.config
    text, ids = non_canonical(tok)
    canon = tok.encode_text(text)
    question, follow_up = Message.user("Say it."), Message.user("Again?")
    head = build_prompt(tok, cfg, [question]).ids  # ends with the assistant's tag
    with_ids = build_prompt(tok, cfg, [question, Message.assistant(text, ids), follow_up]).ids
    from_text = build_prompt(tok, cfg, [question, Message.assistant(text), follow_up]).ids
    assert with_ids[: len(head) + len(ids)] == head + ids
    assert from_text[: len(head) + len(canon)] == head + canon
    assert with_ids[len(head) + len(ids) :] == from_text[len(head) + len(canon) :]


def test_follow_up_recomputes_only_the_new_turn(demo_model, monkeypatch):
    s = Session(demo_model)
    _, ids = forced_answer(demo_model, monkeypatch, s)
    held = s.cached_tokens  # the question and the answer (its last token never fed)
    events = list(s.ask("Again?", **GEN))
    pre = first(events, PrefillDone)
    assert pre.reused == held, (pre.reused, held)
    new_turn = len(s.token_ids) - len(events[-1].token_ids) + 1 - held
    assert pre.n_tokens == new_turn
    assert events[-1].reused_tokens == held


def test_conversation_sent_as_text_keeps_the_ids(demo_model, monkeypatch):
    """The app sends the stored chat as text (no ids): the session's answers keep theirs."""
    s = Session(demo_model)
    text, _ = forced_answer(demo_model, monkeypatch, s)
    held = s.cached_tokens
    convo = [Message.user("Say it."), Message.assistant(text), Message.user("Again?")]
    pre = first(list(s.respond(convo, **GEN)), PrefillDone)
    assert pre.reused == held


def test_restored_session_keeps_the_ids(demo_model, monkeypatch, tmp_path):
    s = Session(demo_model)
    text, ids = forced_answer(demo_model, monkeypatch, s)
    held = s.cached_tokens
    path = tmp_path / "chat.msession"
    s.save(path)
    # Session.open: messages from the file, with their ids
    b, result = Session.open(demo_model, path)
    assert result.restored and b.messages[-1].ids == ids
    assert first(list(b.ask("Again?", **GEN)), PrefillDone).reused == held
    # restore under the app's text-only messages: the file's ids are adopted
    c = Session(demo_model)
    c.set_messages([Message.user("Say it."), Message.assistant(text)])
    assert c.restore(path).restored and c.messages[-1].ids == ids
    assert first(list(c.ask("Again?", **GEN)), PrefillDone).reused == held


def test_ids_that_do_not_spell_the_text_are_not_used(demo_model, monkeypatch):
    """An edited answer (or ids of another tokenizer) is encoded from its text."""
    s = Session(demo_model)
    text, ids = forced_answer(demo_model, monkeypatch, s)
    s.set_messages([Message.user("Say it."), Message("assistant", text + "!", [], ids)])
    assert s.messages[-1].ids is None
    list(s.ask("Again?", **GEN))  # computes fine from the text


def test_an_old_session_format_is_ignored_with_a_reason(demo_model, tmp_path, monkeypatch):
    """Format 1 files (answers without ids) are not used: the conversation is recomputed."""
    s = Session(demo_model)
    list(s.ask("Hello?", **GEN))
    path = tmp_path / "old.msession"
    with monkeypatch.context() as m:
        m.setattr(persistence, "SESSION_FORMAT", SESSION_FORMAT - 1)
        s.save(path)
    b, result = Session.open(demo_model, path)
    assert not result.restored and f"session format {SESSION_FORMAT - 1}" in result.reason
    assert result.messages_loaded and b.cached_tokens == 0 and len(b.messages) == 2


def test_cli_chat_follow_up_reuses_the_answer(demo_dir, tmp_path):
    """`merlin-cli chat` on the demo model: the follow-up reuses every cached row, whatever
    tokenization the random model's answer used."""
    r = subprocess.run(
        [sys.executable, "-m", "merlin.engine.cli", "chat", "--model", str(demo_dir), "--json",
         "--temperature", "0", "--ignore-eos", "--max-new-tokens", "40", "--spec", "off"],
        input="Tell me a story about a lighthouse.\nAnd then?\n",
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    pre = [e for e in events if e["event"] == "prefill"]
    done = [e for e in events if e["event"] == "finished"]
    assert len(pre) == 2 and len(done) == 2
    held = done[0]["cached_tokens"]
    assert pre[1]["reused"] == held, (pre[1], held)


def test_a_placeholder_the_model_emits_is_text_not_an_image(demo_model, monkeypatch, tmp_path):
    """A model can sample <|image_pad|> or <|video_pad|> like any token. The next prompt must
    not count it as a picture of its own (it had: "2 image placeholder(s) but 1 image(s)",
    and the conversation could not go on): such an answer is encoded from its text."""
    from PIL import Image

    cfg = demo_model.config
    picture = tmp_path / "red.png"
    Image.new("RGB", (64, 64), (220, 20, 20)).save(picture)
    s = Session(demo_model)
    emitted = [cfg.image_token_id, cfg.video_token_id, cfg.image_token_id]
    with monkeypatch.context() as m:
        scripted(m, emitted)
        list(s.ask("What is it?", images=[str(picture)], **dict(GEN, max_new_tokens=3)))
    assert s.messages[-1].ids == emitted
    events = list(s.ask("And now?", **dict(GEN, max_new_tokens=2)))
    assert isinstance(events[-1], Finished)
    prompt = build_prompt(demo_model.tokenizer, cfg, s.messages[:-1])
    n_image = s.messages[0].images[0].n_tokens
    assert prompt.ids.count(cfg.image_token_id) == n_image
    assert cfg.video_token_id not in prompt.ids


def test_any_special_token_the_model_emits_leaves_the_chat_going(demo_model, monkeypatch, tmp_path):
    """Whatever control tokens a model samples inside an answer (all of them here, the stop
    tokens too: ignore_eos), the conversation goes on: a follow-up, a save and a restored
    session's next turn, the picture's placeholders still the picture's alone."""
    from PIL import Image

    tok, cfg = demo_model.tokenizer, demo_model.config
    specials = [i for i in range(cfg.text.vocab_size) if tok.is_special(i)]
    assert len(specials) >= 20 and cfg.image_token_id in specials
    picture = tmp_path / "red.png"
    Image.new("RGB", (64, 64), (220, 20, 20)).save(picture)
    plain = tok.encode_text("ab")
    emitted = [plain[0], *specials, plain[-1]]
    s = Session(demo_model)
    with monkeypatch.context() as m:
        scripted(m, emitted)
        list(s.ask("What?", images=[str(picture)], **dict(GEN, max_new_tokens=len(emitted))))
    assert s.messages[-1].ids == emitted
    assert isinstance(list(s.ask("And?", **dict(GEN, max_new_tokens=2)))[-1], Finished)
    s.save(tmp_path / "chat.msession")
    again, result = Session.open(demo_model, tmp_path / "chat.msession")
    assert result.restored, result.reason
    assert isinstance(list(again.ask("More?", **dict(GEN, max_new_tokens=2)))[-1], Finished)
    prompt = build_prompt(tok, cfg, again.messages[:-1])
    assert prompt.ids.count(cfg.image_token_id) == s.messages[0].images[0].n_tokens


def test_a_file_saved_with_another_tokenizer_is_encoded_from_its_text(demo_model, tmp_path):
    """`chat --session` continued with another model read the file's answers as the ids its
    model made: the new model saw other words (or ids outside its vocabulary failed every
    turn). Ids that are not this tokenizer's spelling of the text are dropped at restore."""
    s = Session(demo_model)
    list(s.ask("Hello?", **GEN))
    answer = s.messages[-1]
    foreign = [(i + 7) % 1000 for i in answer.ids]  # what another tokenizer's ids look like
    assert demo_model.tokenizer.decode(foreign) != answer.text
    s._messages[-1] = Message("assistant", answer.text, [], foreign)
    path = tmp_path / "other.mss"
    s.save(path)
    b, result = Session.open(demo_model, path)
    assert result.messages_loaded and b.messages[-1].ids is None
    assert b.messages[-1].text == answer.text
    as_text = [Message.user("Hello?"), Message("assistant", answer.text)]
    tok, cfg = demo_model.tokenizer, demo_model.config
    assert build_prompt(tok, cfg, b.messages).ids == build_prompt(tok, cfg, as_text).ids
