"""Chat sessions on the demo checkpoint: KV reuse across turns, edit/regenerate, save/restore,
bad session files, cancellation, the context budget, the on-disk store, `merlin-cli chat`.

What "bitwise equal to recomputing from scratch" means here. With f32 weights (most tests here)
a forward of more than linear.SMALL_N rows (prefill) runs its matrix products through
BLAS, a smaller one (decode, verify) through the Numba kernels; the two round differently, so
the KV rows of a conversation depend on how it was cut into forwards (prompt prefill, one-token
decode steps, the next turn's prefill), and no reuse scheme can make a session's cache bitwise
equal to one big prefill of the whole conversation with mixed kernels. The Numba kernels give
every row the same bits whatever the number of rows in the forward (tests/test_spec_generate.py
checks this for verify rows). So the `exact` fixture routes every forward through them (SMALL_N
raised above any prompt length); then a KV row is a pure function of the tokens, 3D positions
and image embeddings before it, and "from scratch" is literally: render the whole conversation
with the chat template, encode each image on its own, one forward over a fresh cache, logits of
the last row. The session's prefill logits of each turn (reused prefix + computed suffix) must
equal those bits. Any reuse bug (a stale row, a wrong position or rope delta, the wrong image
behind identical pad tokens, a misplaced embedding) breaks the equality. Save/restore is also
checked with the default kernels: the restored session continues bit for bit like the one that
never left memory."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from PIL import Image

import merlin.engine.arrayfile as arrayfile
from merlin.engine import linear
from merlin.engine.errors import InputError
from merlin.engine.generate import Finished, PrefillDone, Tokens
from merlin.engine.kv_cache import KVCache
from merlin.engine.model import load_model
from merlin.engine.rope import mrope_positions, text_positions
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import (
    SESSION_KIND,
    ContextTrimmed,
    Message,
    Session,
    SessionSettings,
    SessionStore,
)
from merlin.engine.tokenizer import expand_image_pads

GREEDY = SamplingParams(temperature=0.0)
GEN = dict(sampling=GREEDY, max_new_tokens=6, ignore_eos=True, spec="off")
SYSTEM = "You answer briefly."
_models: dict = {}


def model_for(demo_dir, weights="f32", kv="f32"):
    if (weights, kv) not in _models:
        _models[weights, kv] = load_model(demo_dir, weights=weights, kv=kv)
    return _models[weights, kv]


@pytest.fixture
def exact(monkeypatch):
    """Every forward through the row-exact kernels (see the module docstring)."""
    monkeypatch.setattr(linear, "SMALL_N", 1 << 30)


class Spy:
    """Records the logits of every text forward and counts vision encoder runs."""

    def __init__(self, model, monkeypatch):
        self.logits, self.encodes = [], 0
        forward, encode = model.text.forward, model.vision.encode

        def spy_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            self.logits.append(out)
            return out

        def spy_encode(images, *args, **kwargs):
            self.encodes += len(images)
            return encode(images, *args, **kwargs)

        # embeddings shared by the model's sessions (engine/vision/embed_cache.py): counted
        # from an empty cache, whatever earlier tests encoded
        model.vision.embeddings = type(model.vision.embeddings)()

        monkeypatch.setattr(model.text, "forward", spy_forward)
        monkeypatch.setattr(model.vision, "encode", spy_encode)
        self.forward, self.encode = forward, encode


@pytest.fixture
def spy(demo_model, monkeypatch):
    return Spy(demo_model, monkeypatch)


def image_file(path, seed: int, size=(128, 96)):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture
def images(tmp_path, demo_model):
    """Three prepared images: a, b (other pixels, other size), a2 (a's size, other pixels)."""
    out = {}
    for name, seed, size in (("a", 1, (128, 96)), ("b", 2, (96, 160)), ("a2", 3, (128, 96))):
        out[name] = demo_model.vision.prepare(image_file(tmp_path / f"{name}.png", seed, size))
    assert out["a"].grid_thw == out["a2"].grid_thw
    return out


def image_inputs_from_nothing(spy: Spy, model, ids, ims: list) -> tuple[np.ndarray, dict]:
    """(positions, forward keyword arguments) of a token sequence with its images (already
    expanded to image pads), each image encoded on its own, as the session does."""
    pad = model.config.image_token_id
    if not ims:
        return text_positions(0, len(ids)), {}
    positions, _ = mrope_positions(ids, pad, [im.grid_thw for im in ims], 2)
    outs = [spy.encode([im]) for im in ims]
    return positions, dict(
        embeds=np.concatenate([o.embeds for o in outs]),
        embed_rows=np.flatnonzero(np.asarray(ids) == pad),
        deepstack=[
            np.concatenate([o.deepstack[i] for o in outs]) for i in range(len(outs[0].deepstack))
        ],
    )


def scratch(spy: Spy, model, system: str, conv: list[tuple]) -> tuple[np.ndarray, int]:
    """The conversation computed from nothing: (logits of the last row, prompt length).
    conv: (role, text, [PreparedImage]) or, for an answer, (role, text, [], ids generated),
    ending with the question. An answer is the ids the model generated (the chat template
    renders its text unchanged), not its text encoded again."""
    chat = [{"role": "system", "content": system}] if system else []
    ims, answer_ids = [], {}
    for role, text, images, *ids in conv:
        if role == "user":
            content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
            chat.append({"role": "user", "content": content})
            ims += images
        else:
            if ids and ids[0]:
                answer_ids[len(chat)] = ids[0]
            chat.append({"role": "assistant", "content": text})
    ids = model.tokenizer.encode_chat(chat, add_generation_prompt=True, token_ids=answer_ids)
    pad = model.config.image_token_id
    if ims:
        ids = expand_image_pads(ids, pad, [im.n_tokens for im in ims])
    positions, kw = image_inputs_from_nothing(spy, model, ids, ims)
    cache = model.new_cache(len(ids) + 8)
    return spy.forward(np.asarray(ids), positions, cache, **kw)[-1], len(ids)


def assert_cache_is_scratch(spy: Spy, model, s: Session, ims: list) -> None:
    """Every cached row (prompt rows and decoded answer rows alike) equals a fresh forward of
    the session's token history at positions computed from nothing (ims: the images of the
    history, in order)."""
    ids = s.token_ids
    positions, kw = image_inputs_from_nothing(spy, model, ids, ims)
    fresh = model.new_cache(len(ids) + 8)
    spy.forward(np.asarray(ids), positions, fresh, logits="none", **kw)
    n = len(ids)
    assert np.array_equal(s.cache.keys(), fresh.keys()[..., :n])
    assert np.array_equal(s.cache.v[:, :, :n], fresh.v[:, :, :n])
    assert np.array_equal(s._positions, positions)


def run_turn(spy: Spy, events) -> tuple[list, np.ndarray]:
    """Consume one turn's events; returns them and the logits of its prefill."""
    spy.logits.clear()
    out = list(events)
    return out, spy.logits[0][-1]


def first(events, kind):
    return next(e for e in events if isinstance(e, kind))


def consistent(s: Session) -> None:
    assert s.cached_tokens == s.cache.length
    assert s.token_ids == s._tokens and s._positions.shape == (3, s.cache.length)


# ---- reuse -------------------------------------------------------------------------------------


def test_text_turns_reuse_the_cache_and_match_scratch(demo_model, exact, spy):
    s = Session(demo_model, system=SYSTEM)
    conv, n_prev = [], 0
    for i, q in enumerate(["Hello, who are you?", "Tell me more about rivers.", "Why?"]):
        held = s.cached_tokens
        events, logits = run_turn(spy, s.ask(q, **GEN))
        conv.append(("user", q, []))
        ref, n = scratch(spy, demo_model, SYSTEM, conv)
        assert np.array_equal(logits, ref), f"turn {i}"
        pre = first(events, PrefillDone)
        assert pre.reused + pre.n_tokens == n
        if i:  # the whole previous conversation came from the cache: its prompt, its answer
            assert pre.reused == held > n_prev
        done = events[-1]
        assert isinstance(done, Finished) and done.reused_tokens == pre.reused
        conv.append(("assistant", done.text, [], done.token_ids))
        n_prev = n
        consistent(s)
        assert_cache_is_scratch(spy, demo_model, s, [])
        # speculative drafts look up the whole conversation, not just this turn
        assert s.drafter.history[: s.cached_tokens] == s.token_ids
        assert s.drafter.history[s.cached_tokens :] == done.token_ids[-1:]
    assert [m.role for m in s.messages] == ["user", "assistant"] * 3


def test_image_turns_encode_each_image_once_and_match_scratch(demo_model, exact, spy, images):
    s = Session(demo_model)
    conv = []
    turns = [
        ("What is in this picture?", [images["a"]], 1),
        ("And on the left?", [], 1),
        ("Compare it with this one.", [images["b"]], 2),
        ("Which is brighter?", [], 2),
    ]
    n_prev = 0
    for i, (q, ims, encodes) in enumerate(turns):
        events, logits = run_turn(spy, s.ask(q, ims, **GEN))
        conv.append(("user", q, ims))
        ref, n = scratch(spy, demo_model, "", conv)  # (its encodes are not counted)
        assert np.array_equal(logits, ref), f"turn {i}"
        assert spy.encodes == encodes, f"turn {i}: the encoder ran {spy.encodes} times"
        pre = first(events, PrefillDone)
        assert pre.reused >= n_prev and pre.reused + pre.n_tokens == n
        if not ims:
            assert pre.vision_ms == 0.0
        conv.append(("assistant", events[-1].text, [], events[-1].token_ids))
        n_prev = n
        consistent(s)
        shown = [im for _, _, ims_, *_ in conv for im in ims_]
        assert_cache_is_scratch(spy, demo_model, s, shown)
    # the rope delta is the one of the whole conversation (images advance positions less)
    all_images = [images["a"], images["b"]]
    ids = s.token_ids
    _, delta = mrope_positions(
        ids, demo_model.config.image_token_id, [im.grid_thw for im in all_images], 2
    )
    assert s.rope_delta == delta < 0


def test_prefill_ahead_computes_the_image_rows_the_sent_turn_reuses(demo_model, exact, spy, images):
    """An attached image's rows are computed while the user types (prefill_ahead); the turn
    that sends it with its text reuses them, prefills only the text and gives the logits of
    a conversation computed from nothing. In a later turn too, and with two images."""
    s = Session(demo_model, system=SYSTEM)
    conv = []
    turns = [
        ("What is in this picture?", [images["a"]]),
        ("Compare these two.", [images["b"], images["a2"]]),
    ]
    for i, (q, ims) in enumerate(turns):
        held = s.cached_tokens
        ahead = s.prefill_ahead(ims)
        assert not ahead["cancelled"] and ahead["reused"] == held
        assert ahead["computed"] > sum(im.n_tokens for im in ims)
        assert s.cached_tokens == held + ahead["computed"]
        assert [m.role for m in s.messages] == ["user", "assistant"] * i  # nothing recorded
        consistent(s)
        spy.encodes = 0
        events, logits = run_turn(spy, s.ask(q, ims, **GEN))
        conv.append(("user", q, ims))
        ref, n = scratch(spy, demo_model, SYSTEM, conv)
        assert np.array_equal(logits, ref), f"turn {i}"
        pre = first(events, PrefillDone)
        assert pre.reused == held + ahead["computed"]  # every row computed ahead was kept
        assert pre.n_tokens == n - pre.reused < 32  # the question's text and the turn's end
        assert pre.vision_ms == 0.0 and spy.encodes == 0  # encoded ahead, not again
        conv.append(("assistant", events[-1].text, [], events[-1].token_ids))
        consistent(s)


def test_prefill_ahead_stops_when_cancelled_and_leaves_a_usable_cache(demo_model, exact, images):
    s = Session(demo_model)
    cancel = threading.Event()
    cancel.set()
    ahead = s.prefill_ahead([images["a"]], cancel)
    assert ahead["cancelled"] and s.cached_tokens == 0
    consistent(s)
    events = list(s.ask("What is in this picture?", [images["a"]], **GEN))
    assert isinstance(events[-1], Finished)


def test_regenerate_and_edits_match_scratch(demo_model, exact, spy, images):
    s = Session(demo_model, system=SYSTEM)
    conv = []
    for q, ims in (("Describe the picture.", [images["a"]]), ("More.", []), ("Why so?", [])):
        events, _ = run_turn(spy, s.ask(q, ims, **GEN))
        conv += [("user", q, ims), ("assistant", events[-1].text, [], events[-1].token_ids)]
    last_answer = events[-1].token_ids
    encodes = spy.encodes

    # regenerate: everything but the last prompt token is reused, same greedy answer
    events, logits = run_turn(spy, s.regenerate(**GEN))
    ref, n = scratch(spy, demo_model, SYSTEM, conv[:-1])
    assert np.array_equal(logits, ref)
    pre = first(events, PrefillDone)
    assert (pre.reused, pre.n_tokens) == (n - 1, 1)
    assert events[-1].token_ids == last_answer
    assert len(s.messages) == 6
    consistent(s)

    # edit the second question: the first turn is reused
    n_turn1 = scratch(spy, demo_model, SYSTEM, conv[:1])[1]
    events, logits = run_turn(spy, s.edit(2, "Something else entirely?", **GEN))
    edited = conv[:2] + [("user", "Something else entirely?", [])]
    ref, n = scratch(spy, demo_model, SYSTEM, edited)
    assert np.array_equal(logits, ref)
    assert first(events, PrefillDone).reused >= n_turn1
    assert len(s.messages) == 4
    consistent(s)

    # edit the first question's text, keep its image: the image rows are reused, not encoded
    spy.encodes = encodes
    events, logits = run_turn(spy, s.edit(0, "Describe the colours.", **GEN))
    ref, n = scratch(spy, demo_model, SYSTEM, [("user", "Describe the colours.", [images["a"]])])
    assert np.array_equal(logits, ref)
    assert first(events, PrefillDone).reused > images["a"].n_tokens
    assert spy.encodes == encodes

    # swap the image for another of the same size: identical token ids, other content; the
    # cache must stop before the image (content hash), which is encoded
    events, logits = run_turn(spy, s.edit(0, "Describe the colours.", [images["a2"]], **GEN))
    assert spy.encodes == encodes + 1
    ref, n = scratch(spy, demo_model, SYSTEM, [("user", "Describe the colours.", [images["a2"]])])
    assert np.array_equal(logits, ref)
    image_start = s._spans[0][0]
    assert first(events, PrefillDone).reused <= image_start
    consistent(s)


def test_declarative_respond_finds_the_common_prefix(demo_model, exact, spy):
    """The app's way: pass the whole stored conversation every time."""
    s = Session(demo_model)
    convo = [Message.user("First question?")]
    events, _ = run_turn(spy, s.respond(convo, **GEN))
    convo += [Message.assistant(events[-1].text), Message.user("Second?")]
    events, logits = run_turn(spy, s.respond(convo, **GEN))
    # the answer sent back as text is the session's answer: its generated ids are used
    conv = [(m.role, m.text, [], m.ids) for m in s.messages[:-1]]
    ref, n = scratch(spy, demo_model, "", conv)
    assert np.array_equal(logits, ref)
    assert first(events, PrefillDone).reused > 0
    # the app changed its mind about the first question: same session, no special call
    convo2 = [Message.user("Another first question?")]
    events, logits = run_turn(spy, s.respond(convo2, **GEN))
    assert np.array_equal(logits, scratch(spy, demo_model, "", [("user", convo2[0].text, [])])[0])
    assert [m.role for m in s.messages] == ["user", "assistant"]


@pytest.mark.parametrize("dequantizing", [False, True], ids=["grouped", "row-major"])
def test_quantized_prefill_is_exact(demo_dir, monkeypatch, dequantizing):
    """q8 weights. Grouped (x86 with AVX512-VNNI): the prompt is one forward through the
    decode kernels, whose rows are the same bits at any N, so the cache equals a scratch
    forward with no kernel forced. Row-major (aarch64; faked here): a suffix of up to
    small_prefill_rows rows is fed as forwards of SMALL_N rows (no dequantization pass);
    rows stay bitwise what one forward through the same kernels gives."""
    model = model_for(demo_dir, weights="q8")
    if dequantizing:
        monkeypatch.setattr(linear, "prefill_dequantizes", lambda lin: True)
    chunked = any(map(linear.prefill_dequantizes, model.text.w.matrices()))
    spy = Spy(model, monkeypatch)
    s = Session(model, settings=SessionSettings(small_prefill_rows=10**6))
    for q in ("Hello there, how are you today?", "Tell me about the river and the bridge."):
        spy.logits.clear()
        events = list(s.ask(q, **GEN))
        pre = first(events, PrefillDone)
        prefill_rows = len(spy.logits) - (len(events[-1].token_ids) - 1)
        assert pre.n_tokens > linear.SMALL_N
        assert prefill_rows == (-(-pre.n_tokens // linear.SMALL_N) if chunked else 1)
        assert events[-1].prompt_tokens == pre.n_tokens
    with monkeypatch.context() as m:
        if chunked:
            m.setattr(linear, "SMALL_N", 1 << 30)
        assert_cache_is_scratch(spy, model, s, [])
    if not chunked:
        return
    # cancelled while the first chunks are fed: no answer, a consistent session
    cancel = threading.Event()
    cancel.set()
    events = list(s.ask("And what about the old town near the harbour, please?", cancel=cancel))
    assert events[-1].reason == "cancelled" and events[-1].generated_tokens == 0
    assert s.messages[-1] == Message("assistant", "")
    consistent(s)
    assert isinstance(list(s.ask("Go on.", **GEN))[-1], Finished)


# ---- save / restore ----------------------------------------------------------------------------


def two_turns(s: Session, images) -> None:
    for q, ims in (("What is this?", [images["a"]]), ("Tell me more.", [])):
        list(s.ask(q, ims, **GEN))


@pytest.mark.parametrize("kv", ["f32", "q8"])
def test_restored_session_continues_bitwise(demo_dir, tmp_path, kv, monkeypatch, images):
    """Default kernels: the restored session's next turn equals the in-memory one's."""
    model = model_for(demo_dir, kv=kv)
    spy = Spy(model, monkeypatch)
    a = Session(model, system=SYSTEM)
    two_turns(a, images)
    path = tmp_path / "chat.msession"
    size = a.save(path)
    assert size == path.stat().st_size > a.cache_bytes
    b, result = Session.open(model, path)
    assert result.restored and result.tokens == a.cached_tokens, result.reason
    assert b.token_ids == a.token_ids and b.system == SYSTEM
    assert [m.key() for m in b.messages] == [m.key() for m in a.messages]
    assert b.rope_delta == a.rope_delta and np.array_equal(b._positions, a._positions)
    encodes = spy.encodes
    ev_a, logits_a = run_turn(spy, a.ask("And the colours?", **GEN))
    ev_b, logits_b = run_turn(spy, b.ask("And the colours?", **GEN))
    assert np.array_equal(logits_a, logits_b)
    assert ev_a[-1].token_ids == ev_b[-1].token_ids
    assert first(ev_b, PrefillDone).reused == first(ev_a, PrefillDone).reused > 0
    assert spy.encodes == encodes  # the image embedding came from the file
    # editing the first turn after the restore re-uses the saved embedding, too
    list(b.edit(0, "What colour is it?", **GEN))
    assert spy.encodes == encodes


def test_a_session_restored_under_other_vision_weights_encodes_its_pictures_again(
    demo_dir, tmp_path
):
    """A file saved with q8 vision weights, opened with f32 ones (and other text weights: the
    cache is not used): the chat goes on (its picture's hash, made under q8, had been taken
    for a changed file). A picture whose file changed since goes on with the embedding the
    file keeps (of the picture that was asked about; it had failed every turn)."""
    picture = image_file(tmp_path / "a.png", 1)
    saved = load_model(demo_dir, weights="q8", kv="f32", vision_weights="q8")
    a = Session(saved)
    list(a.ask("What is this?", [str(picture)], **GEN))
    a.save(tmp_path / "chat.msession")
    other = load_model(demo_dir, weights="f32", kv="f32", vision_weights="f32")
    b, result = Session.open(other, tmp_path / "chat.msession")
    assert not result.restored and len(b.messages) == 2
    assert isinstance(list(b.ask("And the colours?", **GEN))[-1], Finished)
    image_file(picture, 2)  # other pixels, same size; a model without its embedding
    fresh = load_model(demo_dir, weights="f32", kv="f32", vision_weights="f32")
    c, result = Session.open(fresh, tmp_path / "chat.msession")
    assert result.images_kept == 1
    assert isinstance(list(c.ask("And now?", **GEN))[-1], Finished)


def test_restore_matches_scratch_and_app_path(demo_model, tmp_path, exact, spy, images):
    a = Session(demo_model, system=SYSTEM)
    two_turns(a, images)
    path = tmp_path / "chat.msession"
    a.save(path)
    conv = []
    for m in a.messages:  # answers: the ids they were generated as (kept in the file)
        conv.append((m.role, m.text, [images["a"]] if m.images else [], m.ids))
    # the app's path: its own stored messages, then restore() for the cache
    b = Session(demo_model, system=SYSTEM)
    b.set_messages([Message(m.role, m.text, [images["a"]] if m.images else []) for m in a.messages])
    result = b.restore(path)
    assert result.restored and not result.messages_loaded
    events, logits = run_turn(spy, b.ask("And the colours?", **GEN))
    ref, n = scratch(spy, demo_model, SYSTEM, conv + [("user", "And the colours?", [])])
    assert np.array_equal(logits, ref)
    assert first(events, PrefillDone).reused == a.cached_tokens  # the whole conversation


def test_bad_session_files_are_ignored_and_recomputed(
    demo_dir, demo_model, tmp_path, exact, spy, images, caplog
):
    a = Session(demo_model)
    two_turns(a, images)
    good = tmp_path / "good.msession"
    a.save(good)
    data = good.read_bytes()
    kv = KVCache(2, 2, 4, 16)
    kv.reserve(3)
    kv.length = 3
    kv.save(tmp_path / "kv.bin")
    newer = bytearray(data)
    newer[8] = 99  # container version
    cases = {
        "truncated": data[: len(data) // 2],
        "one byte short": data[:-1],
        "payload bit flip": data[:200] + bytes([data[200] ^ 1]) + data[201:],
        "header bit flip": data[:-100] + bytes([data[-100] ^ 1]) + data[-99:],
        "empty": b"",
        "foreign": os.urandom(5000),
        "png": (tmp_path / "a.png").read_bytes(),
        "kv file": (tmp_path / "kv.bin").read_bytes(),
        "newer": bytes(newer),
    }
    for name, blob in cases.items():
        path = tmp_path / f"{name}.msession"
        path.write_bytes(blob)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="merlin.engine.session"):
            result = Session(demo_model).restore(path)
        assert not result.restored and result.reason, name
        assert any(str(path) in r.getMessage() for r in caplog.records), name
    # another weights format, another KV format: the identity does not match
    for weights, kv_fmt, word in (("q8", "f32", "weights"), ("f32", "q8", "KV")):
        other = model_for(demo_dir, weights, kv_fmt)
        result = Session(other).restore(good)
        assert not result.restored and word in result.reason, result.reason
    # a missing file: no saved session (not a warning)
    assert Session(demo_model).restore(tmp_path / "nope.msession").reason == "no saved session"

    # damaged payload through Session.open: the messages are kept and recomputed correctly
    b, result = Session.open(demo_model, tmp_path / "payload bit flip.msession")
    assert not result.restored and result.messages_loaded and b.cached_tokens == 0
    assert [m.key() for m in b.messages] == [m.key() for m in a.messages]
    events, logits = run_turn(spy, b.ask("Go on.", **GEN))
    conv = [(m.role, m.text, [images["a"]] if m.images else [], m.ids) for m in a.messages]
    ref, _ = scratch(spy, demo_model, "", conv + [("user", "Go on.", [])])
    assert np.array_equal(logits, ref)
    assert first(events, PrefillDone).reused == 0
    # a session file for another model format: messages kept, image prepared again from disk
    other = model_for(demo_dir, "q8", "f32")
    c, result = Session.open(other, good)
    assert not result.restored and result.messages_loaded
    assert isinstance(list(c.ask("Go on.", **GEN))[-1], Finished)


# ---- cancellation ------------------------------------------------------------------------------


def test_cancel_and_abandon_keep_the_session_consistent(demo_model, exact, spy, images):
    s = Session(demo_model)
    conv = []
    events, _ = run_turn(spy, s.ask("What is this?", [images["a"]], **GEN))
    conv += [
        ("user", "What is this?", [images["a"]]),
        ("assistant", events[-1].text, [], events[-1].token_ids),
    ]
    cancel = threading.Event()
    got = []
    gen = dict(GEN, max_new_tokens=20, spec="on")
    for ev in s.ask("Tell me a long story.", cancel=cancel, **gen):
        if isinstance(ev, Tokens):
            got += ev.ids
            if len(got) >= 3:
                cancel.set()
        if isinstance(ev, Finished):
            done = ev
    assert done.reason == "cancelled" and 3 <= len(got) < 20
    assert s.messages[-1].role == "assistant" and s.messages[-1].text == done.text
    consistent(s)
    assert s.messages[-1].ids == got  # the partial answer keeps the ids it was cut at
    conv += [("user", "Tell me a long story.", []), ("assistant", done.text, [], got)]
    events, logits = run_turn(spy, s.ask("Shorter, please.", **GEN))
    conv.append(("user", "Shorter, please.", []))
    assert np.array_equal(logits, scratch(spy, demo_model, "", conv)[0])
    # the same answer as a fresh session that is given the conversation
    fresh = Session(demo_model)
    fresh_events = list(fresh.respond(s.messages[:-1], **GEN))
    assert fresh_events[-1].token_ids == events[-1].token_ids
    conv.append(("assistant", events[-1].text, [], events[-1].token_ids))

    # the caller stops iterating mid-answer (window closed): the partial answer is kept
    it = s.ask("One more?", **dict(GEN, max_new_tokens=20))
    n = 0
    for ev in it:
        if isinstance(ev, Tokens):
            n += 1
            if n == 2:
                break
    it.close()
    assert s.messages[-1].role == "assistant" and s.messages[-2].text == "One more?"
    consistent(s)
    conv += [("user", "One more?", []), ("assistant", s.messages[-1].text, [], s.messages[-1].ids)]
    events, logits = run_turn(spy, s.ask("Last one.", **GEN))
    conv.append(("user", "Last one.", []))
    assert np.array_equal(logits, scratch(spy, demo_model, "", conv)[0])

    # a failure before any token leaves the conversation as it was
    before = [m.key() for m in s.messages]
    it = s.ask("Will fail.", **GEN)
    spy.logits.clear()

    def boom(*a, **k):
        raise MemoryError("simulated")

    s.model.text.forward, keep = boom, s.model.text.forward
    try:
        with pytest.raises(MemoryError):
            list(it)
    finally:
        s.model.text.forward = keep
    assert [m.key() for m in s.messages] == before
    consistent(s)


# ---- context budget ----------------------------------------------------------------------------


def test_context_budget_drops_old_turns_visibly(demo_model, exact, spy, images):
    budget = 320
    s = Session(
        demo_model,
        system=SYSTEM,
        settings=SessionSettings(context_budget=budget, answer_reserve=16),
    )
    question = "Please tell me about the river, the bridge and the old town near the harbour?"
    trimmed = None
    conv = []
    for i in range(12):
        ims = [images["a"]] if i == 0 else []
        events, logits = run_turn(spy, s.ask(question + f" ({i})", ims, **GEN))
        conv += [("user", question + f" ({i})", ims)]
        trims = [e for e in events if isinstance(e, ContextTrimmed)]
        done = events[-1]
        assert isinstance(done, Finished) and done.reason == "max_tokens"
        if trims:
            trimmed = trims[0]
            break
        conv.append(("assistant", done.text, [], done.token_ids))
    assert trimmed is not None, "the budget never filled up"
    # visible: an event with a notice, the notice in the totals, the indexes in the session
    assert trimmed.dropped and "context budget" in trimmed.notice
    assert trimmed.notice in done.notices
    assert done.dropped_messages == s.dropped == trimmed.dropped
    assert 0 not in s.dropped  # the message with the latest image is kept
    assert "latest image" in trimmed.notice
    # what the model saw: system prompt + kept messages + the whole question, nothing else
    kept = [c for j, c in enumerate(conv) if j not in set(trimmed.dropped)]
    ref, n = scratch(spy, demo_model, SYSTEM, kept)
    assert np.array_equal(logits, ref)
    assert n + 16 <= budget and s.cached_tokens <= budget
    assert len(s.messages) == len(conv) + 1  # nothing was removed from the chat itself
    # the next turn fits without dropping more, and reuses the cache again
    events, _ = run_turn(spy, s.ask("Short?", **GEN))
    assert not any(isinstance(e, ContextTrimmed) for e in events)
    assert first(events, PrefillDone).reused > 0
    # a question that cannot fit even alone: a clear error, the session untouched
    before, cached = [m.key() for m in s.messages], s.cached_tokens
    with pytest.raises(InputError, match="context budget"):
        s.ask("river " * 400, **GEN)
    assert [m.key() for m in s.messages] == before and s.cached_tokens == cached


def _trimmed_chat(model, budget=300, turns=9) -> Session:
    s = Session(model, system=SYSTEM, settings=SessionSettings(context_budget=budget))
    for i in range(turns):
        for _ in s.ask(f"question number {i}: tell me about item {i * 7} please", **GEN):
            pass
    assert s.dropped, "the budget never filled up"
    return s


def _answer(events) -> Finished:
    return [e for e in events if isinstance(e, Finished)][-1]


def test_an_earlier_answer_asked_again_in_a_trimmed_chat_sees_its_question(demo_model):
    """Messages left out to fit a long chat stayed left out when an earlier answer was
    asked for again (a regenerate or a version far back): the question itself was among
    them, and the model answered a prompt with no question. Going back further than the
    last question, the budget decides afresh, as for a fresh session."""
    s = _trimmed_chat(demo_model)
    late = max(s.dropped) + 1  # a question after them: regenerating its answer keeps them
    for upto in (5, [i for i, m in enumerate(s.messages) if m.role == "user"][-1] + 1):
        again = _trimmed_chat(demo_model)
        msgs = again.messages[:upto]
        got = _answer(again.respond(msgs, **GEN))
        fresh = Session(demo_model, system=SYSTEM, settings=SessionSettings(context_budget=300))
        want = _answer(fresh.respond(msgs, **GEN))
        if upto <= late:
            assert (
                got.dropped_messages == want.dropped_messages
                and upto - 1 not in got.dropped_messages
            )
            assert got.token_ids == want.token_ids
        else:  # the last answer again: what was left out stays so (the cache is reused)
            assert set(got.dropped_messages) >= set(s.dropped)


def test_a_session_opened_under_a_larger_budget_sees_what_now_fits(demo_model, tmp_path):
    """Restored (the app's path and the CLI's), the messages left out under the old budget
    stayed left out under a larger one; changed in memory they came back."""
    s = _trimmed_chat(demo_model)
    s.save(tmp_path / "c.mss")
    roomy = SessionSettings(context_budget=2000)
    opened, _ = Session.open(demo_model, tmp_path / "c.mss", roomy, SYSTEM)
    got = _answer(opened.ask("and finally?", **GEN))
    fresh = Session(demo_model, system=SYSTEM, settings=roomy)
    want = _answer(fresh.respond([*s.messages, Message("user", "and finally?")], **GEN))
    assert got.dropped_messages == want.dropped_messages == []
    assert got.token_ids == want.token_ids
    app = Session(demo_model, system=SYSTEM, settings=roomy)  # the app: its own messages
    app.set_messages(s.messages)
    assert app.restore(tmp_path / "c.mss").restored
    assert _answer(app.ask("and finally?", **GEN)).dropped_messages == []


# ---- files and the store -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["f32", "q8"])
def test_kv_cache_save_load_roundtrip(tmp_path, fmt):
    rng = np.random.default_rng(0)
    kv = KVCache(3, 2, 8, 100, fmt)
    for start, n in ((0, 5), (5, 7)):
        kv.reserve(start + n)
        for layer in range(3):
            kv.write(
                layer,
                start,
                rng.standard_normal((n, 2, 8), dtype=np.float32),
                rng.standard_normal((n, 2, 8), dtype=np.float32),
            )
        kv.length = start + n
    path = tmp_path / "kv.bin"
    kv.save(path, {"note": "x"})
    back, meta = KVCache.load(path, max_tokens=100)
    assert meta["note"] == "x" and back.length == kv.length and back.fmt == fmt
    n = kv.length
    for name in ("k", "v", "k_scale", "v_scale"):
        a, b = getattr(kv, name), getattr(back, name)
        if name == "k":
            assert np.array_equal(a[..., :n], b[..., :n])
        else:
            assert np.array_equal(a[:, :, :n], b[:, :, :n])
    data = path.read_bytes()
    path.write_bytes(data[:100] + bytes([data[100] ^ 4]) + data[101:])
    with pytest.raises(arrayfile.FileFormatError, match="checksum"):
        KVCache.load(path)


def small_session(model, text: str) -> Session:
    s = Session(model)
    list(s.ask(text, **dict(GEN, max_new_tokens=2)))
    return s


def test_store_is_bounded_lru_and_survives_full_disk(demo_model, tmp_path, monkeypatch, caplog):
    folder = tmp_path / "sessions"
    store = SessionStore(folder, cap_bytes=1 << 30)
    sessions = {k: small_session(demo_model, f"Question {k}?") for k in "abc"}
    for i, (k, s) in enumerate(sessions.items()):
        r = store.save(s, f"chat-{k}")
        assert r.saved and r.file_bytes > 0
        os.utime(r.path, (1000 + i, 1000 + i))
    usage = store.usage()
    assert usage.files == 3 and usage.bytes == sum(p.stat().st_size for p in folder.iterdir())
    # restoring a marks it recently used; a smaller cap evicts the least recently used (b)
    assert store.restore(Session(demo_model), "chat-a").restored
    one = store.path_for("chat-a").stat().st_size
    removed = store.set_cap(2 * one + one // 2)
    assert [p.name for p in removed] == [store.path_for("chat-b").name]
    assert store.usage().bytes <= store.cap_bytes
    # odd keys become safe file names
    assert store.path_for("../../etc/passwd").parent == folder

    # a full disk while saving: a clear reason, the previous file intact, no temp files left
    real_open = open

    class FullDisk:
        def __init__(self, path, mode):
            self.f = real_open(path, mode)
            self.n = 0

        def write(self, b):
            self.n += len(b)
            if self.n > 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    store.set_cap(1 << 30)
    before = store.path_for("chat-a").read_bytes()
    s = sessions["a"]
    list(s.ask("Another question?", **dict(GEN, max_new_tokens=2)))
    monkeypatch.setattr(arrayfile, "open", FullDisk, raising=False)
    # (the session loggers' level: another test may have run `merlin-cli chat` in-process,
    # which quiets them)
    with caplog.at_level(logging.WARNING, logger="merlin.engine.session"):
        r = store.save(s, "chat-a")
    monkeypatch.undo()
    assert not r.saved and "disk is full" in r.reason and "chat itself is kept" in r.reason
    assert any("disk is full" in rec.getMessage() for rec in caplog.records)
    assert store.path_for("chat-a").read_bytes() == before
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert store.restore(Session(demo_model), "chat-a").restored
    assert isinstance(list(s.ask("Still fine?", **dict(GEN, max_new_tokens=2)))[-1], Finished)

    # the folder was deleted: restore says so, save creates it again
    import shutil

    shutil.rmtree(folder)
    assert store.restore(Session(demo_model), "chat-a").reason == "no saved session"
    assert store.save(s, "chat-a").saved and store.usage().files == 1
    # a session larger than the cap is not written (and the reason says what to do)
    store.cap_bytes = 1000
    r = store.save(s, "chat-a")
    assert not r.saved and "limit" in r.reason and not store.path_for("chat-a").exists()
    store.cap_bytes = 1 << 30
    assert store.clear() > 0 or store.usage().files == 0


# ---- merlin-cli chat ---------------------------------------------------------------------------


def run_chat(demo_dir, stdin: str, *extra):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "merlin.engine.cli",
            "chat",
            "--model",
            str(demo_dir),
            "--temperature",
            "0",
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--json",
            *extra,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def answers(stdout: str) -> list[list[int]]:
    events = [json.loads(line) for line in stdout.splitlines()]
    return [e["token_ids"] for e in events if e["event"] == "finished"], events


def test_cli_chat_continues_across_processes(demo_dir, tmp_path):
    image = image_file(tmp_path / "pic.png", 7)
    turns = [f"/image {image}", "What is in the picture?", "Tell me more.", "And then?"]
    one = run_chat(demo_dir, "\n".join(turns) + "\n")
    assert one.returncode == 0, one.stderr
    whole, events = answers(one.stdout)
    assert len(whole) == 3
    prefills = [e for e in events if e["event"] == "prefill"]
    assert prefills[0]["reused"] == 0 and all(p["reused"] > 0 for p in prefills[1:])

    session = tmp_path / "chat.msession"
    first_run = run_chat(demo_dir, "\n".join(turns[:2]) + "\n", "--session", str(session))
    assert first_run.returncode == 0, first_run.stderr
    assert answers(first_run.stdout)[0] == whole[:1]
    second = run_chat(demo_dir, "\n".join(turns[2:]) + "\n", "--session", str(session))
    assert second.returncode == 0, second.stderr
    got, events = answers(second.stdout)
    assert got == whole[1:]  # identical to the single-process conversation
    assert events[0]["event"] == "session" and events[0]["restored"] is True
    assert [e for e in events if e["event"] == "prefill"][0]["reused"] > 0
    assert sum(e["event"] == "saved" for e in events) == 2

    # a file that is not one of our sessions is never replaced: one line, exit 2, unchanged
    session.write_bytes(b"not a session")
    bad = run_chat(demo_dir, "Hello?\n", "--session", str(session))
    assert bad.returncode == 2, bad.stderr
    assert "not changed" in bad.stderr and "Traceback" not in bad.stderr
    assert session.read_bytes() == b"not a session"
    # a bad image: one clear line, the other turns still answered, exit status 2
    r = run_chat(demo_dir, f"/image {tmp_path / 'missing.png'}\nHi?\nHello again?\n")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "missing.png" in r.stderr and len(answers(r.stdout)[0]) == 1
    # only "/image" and a path is the command: a question starting so is a turn
    r = run_chat(demo_dir, "/images look blurry, why?\n/imagery is nice\n")
    assert r.returncode == 0 and len(answers(r.stdout)[0]) == 2, r.stderr
    # a picture with no turn after it is named, not dropped in silence
    r = run_chat(demo_dir, "Hi?\n/image " + str(tmp_path / "late.png") + "\n")
    assert r.returncode == 2 and "late.png" in r.stderr and len(answers(r.stdout)[0]) == 1


def test_kv_cache_budget_change_keeps_the_rows():
    """The cache holds its whole budget; a changed budget moves the stored rows to new
    arrays (the session follows a changed setting this way), and writing past the budget is
    refused before any kernel runs."""
    from merlin.engine.errors import InputError
    from merlin.engine.kv_cache import KVCache

    rng = np.random.default_rng(5)
    for fmt in ("f32", "q8"):
        cache = KVCache(2, 2, 8, 8, fmt)
        k, v = rng.standard_normal((2, 6, 2, 8), dtype=np.float32)
        cache.reserve(6)
        for layer in range(2):
            cache.write(layer, 0, k, v)
        cache.length = 6
        before = [cache.keys()] + [
            a[:, :, :6].copy() for a in (cache.v, cache.k_scale, cache.v_scale)
        ]
        cache.set_budget(100)
        assert cache.capacity == cache.max_tokens == 100 and cache.length == 6
        after = [cache.keys()] + [a[:, :, :6] for a in (cache.v, cache.k_scale, cache.v_scale)]
        for a, b in zip(before, after):
            assert np.array_equal(a, b)
        cache.reserve(100)
        with pytest.raises(InputError, match="context"):
            cache.reserve(101)
        with pytest.raises(ValueError):
            cache.set_budget(4)  # 6 rows stored: truncate first


def test_warm_computes_the_conversation_as_it_stands(demo_model):
    """warm(): nothing to do for an empty chat (the template had raised); with a system
    prompt or messages, the rows the next turn then reuses."""
    empty = Session(demo_model)
    assert empty.warm()["computed"] == 0 and empty.cached_tokens == 0
    s = Session(demo_model, system=SYSTEM)
    done = s.warm()
    assert done["computed"] > 0 and not done["cancelled"]
    events = list(s.ask("Hello?", **GEN))
    assert first(events, PrefillDone).reused >= done["computed"] - 1


def test_a_file_longer_than_the_context_budget_says_so(demo_model, tmp_path):
    """Opened with a smaller context budget than it was saved with: not restored, for that
    reason (it had been called damaged); its messages go on, recomputed."""
    a = Session(demo_model, system=SYSTEM)
    list(a.ask("Hello there, how are you today?", **GEN))
    a.save(tmp_path / "chat.msession")
    small = SessionSettings(context_budget=a.cached_tokens - 5)
    b, result = Session.open(demo_model, tmp_path / "chat.msession", settings=small)
    assert not result.restored and "damaged" not in result.reason
    assert f"more than the context budget of {a.cached_tokens - 5} tokens" in result.reason
    assert len(b.messages) == 2


def test_a_fine_tune_of_the_same_size_and_times_is_another_checkpoint(demo_dir, tmp_path):
    """A session saved on a checkpoint is not restored on another with the same config, file
    names, sizes and modification times whose weights differ in the middle of the file only
    (a merged LoRA: header, embeddings and vision tower unchanged); it was, and the answer
    came from the other model's KV cache. A copy that keeps the times restores."""
    import shutil

    copy, tuned = tmp_path / "copy", tmp_path / "tuned"
    shutil.copytree(demo_dir, copy)  # copy2: the times are kept
    shutil.copytree(demo_dir, tuned)
    weights = tuned / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = slice(len(data) * 3 // 10, len(data) * 7 // 10)
    data[middle] = bytes(b ^ 0x80 for b in data[middle])  # bf16 signs, mostly
    stat = (demo_dir / "model.safetensors").stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    a = Session(load_model(demo_dir))
    list(a.ask("Hello?", **GEN))
    a.save(tmp_path / "chat.msession")
    same, result = Session.open(load_model(copy), tmp_path / "chat.msession")
    assert result.restored, result.reason
    other, result = Session.open(load_model(tuned), tmp_path / "chat.msession")
    assert not result.restored and "other weight files" in result.reason
    assert len(other.messages) == 2
    # a file an earlier Merlin saved (its fingerprint made another way) says so
    with arrayfile.Reader(tmp_path / "chat.msession", SESSION_KIND) as r:
        arrays = {name: r.read(name) for name in r.entries}
        meta = r.meta
    meta["identity"]["checkpoint"] = "0123456789abcdef"
    arrayfile.write(
        tmp_path / "old.msession",
        SESSION_KIND,
        meta,
        [arrayfile.array_spec(n, a) for n, a in arrays.items()],
    )
    _, result = Session.open(load_model(demo_dir), tmp_path / "old.msession")
    assert not result.restored and "earlier Merlin" in result.reason


def test_editing_a_restored_message_refuses_a_changed_picture(demo_dir, tmp_path):
    """A session restored without its cache (other weights): an unchanged picture is taken at
    the budget it was sent with; one whose file changed goes on with the embedding the file
    keeps (the picture asked about), and where there is none (the app's stored messages,
    no session file) editing that message refuses the file as asking does (the edit had gone
    on with the new picture)."""
    from merlin.engine.vision.budget import BudgetedImage

    picture = image_file(tmp_path / "a.png", 1, (640, 480))
    a = Session(load_model(demo_dir, weights="f32", kv="f32"))
    list(a.ask("What is this?", [BudgetedImage(str(picture), 64)], **GEN))  # a budget of its own
    saved = a.messages[0].images[0]
    assert saved.n_tokens <= 64
    a.save(tmp_path / "chat.msession")
    other = load_model(demo_dir, weights="q8", kv="f32")
    b, result = Session.open(other, tmp_path / "chat.msession")
    assert not result.restored
    list(b.edit(0, "What is it?", **GEN))
    assert b.messages[0].images[0].grid_thw == saved.grid_thw  # its own budget, not the default
    image_file(picture, 2, (640, 480))  # other pixels, same size
    c, _ = Session.open(load_model(demo_dir, weights="q8", kv="f32"), tmp_path / "chat.msession")
    assert isinstance(list(c.edit(0, "What is it now?", **GEN))[-1], Finished)
    d = Session(load_model(demo_dir, weights="q8", kv="f32"))
    with pytest.raises(InputError, match="changed on disk"):
        d.set_messages([Message("user", "What is it?", [saved]), Message("assistant", "A.")])


def test_an_earlier_turns_budget_another_model_does_not_allow_is_the_nearest(demo_model, tmp_path):
    """A picture kept with a budget chosen under another model (the app stores each
    message's): from an earlier turn (strict=False) it is read at the nearest budget this
    model allows, where a budget just chosen (strict) is refused with that nearest value."""
    from merlin.engine.vision.budget import BudgetedImage, InvalidBudget, max_tokens

    picture = image_file(tmp_path / "a.png", 1, (640, 480))
    too_many = max_tokens(demo_model.vision.preprocess) + 1000
    s = Session(demo_model)
    with pytest.raises(InvalidBudget):
        s.image(BudgetedImage(str(picture), too_many))
    kept = s.image(BudgetedImage(str(picture), too_many, strict=False))
    assert kept.n_tokens <= max_tokens(demo_model.vision.preprocess)
    assert isinstance(list(s.ask("What is it?", [kept], **GEN))[-1], Finished)


def test_a_conversation_never_grows_into_a_file_its_reader_refuses(demo_model, tmp_path):
    """65 pictures in one message were asked about and saved, and the file was then refused as
    damaged (its reader takes 64): the question is refused when asked. A conversation longer
    than a session file keeps is not saved (the previous file stays) instead of written."""
    from merlin.engine import session_check
    from merlin.engine.prompt import MAX_IMAGES_PER_MESSAGE

    img = tmp_path / "p.png"
    Image.new("RGB", (32, 32), (10, 200, 10)).save(img)
    s = Session(demo_model)
    with pytest.raises(InputError, match=f"at most {MAX_IMAGES_PER_MESSAGE}"):
        s.ask("which?", images=[str(img)] * (MAX_IMAGES_PER_MESSAGE + 1), max_new_tokens=1)
    assert s.messages == []
    for _ in s.ask("hi", max_new_tokens=1):
        pass
    path = tmp_path / "s.mss"
    s.save(path)
    before = path.read_bytes()
    import dataclasses

    long = "x" * (session_check.MAX_SAVED_TEXT_CHARS + 1)  # as if grown over many turns
    s._messages[0] = dataclasses.replace(s._messages[0], text=long)
    with pytest.raises(arrayfile.FileSaveError, match="not saved"):
        s.save(path)
    assert path.read_bytes() == before
