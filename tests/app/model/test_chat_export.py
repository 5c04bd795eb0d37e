"""Chat export and import (Qt-free): JSON round trip with images, Markdown with images beside
it, and every bad file refused with a message before anything is written (never a half
import). A thinking model's reasoning goes with its answer: a folded block in Markdown, a field
of its own in JSON (format version 2; version 1 files still import)."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import sqlite3
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merlin.app.model import chat_export
from merlin.app.model.chat_export import ChatFileError, read_json
from merlin.app.model.store import Store

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data")
    yield s
    s.close()


def fill(store: Store) -> list[int]:
    a = store.create_conversation("Shapes")
    ref = store.import_image_bytes(PNG, "png", "red dot.png")
    store.add_message(a, "user", "What colour is the dot?", images=[replace(ref, tokens=256)])
    store.add_message(a, "user", "And now?", images=[ref])  # the settings' default budget
    mid = store.add_message(a, "assistant", "It is **red**. <b>not bold</b>")
    store.update_message(mid, stats={"tokens": 5, "tokens_per_s": 40.5})
    b = store.create_conversation("数学")
    store.add_message(b, "user", "1+1?")
    mid = store.add_message(b, "assistant", "", state="streaming", reasoning="")
    store.update_message(mid, "2", "stopped", {"thinking_s": 12.3}, reasoning=REASONING)
    return [a, b]


# what a thinking model may write before it answers: tags, an entity, escapes, code
REASONING = (
    "One plus one: the <b> tag and </details> are text here, AT&amp;T too.\n"
    "\n"
    "In LaTeX \\(1+1\\), in code `<i>` & \\<.\n"
    "```\n"
    "print(1 + 1)  # <no tag>\n"
    "```\n"
    "So: 2."
)


def snapshot(store: Store):
    out = []
    for c in sorted(store.conversations(), key=lambda c: c.id):
        msgs = [
            (m.role, m.text, m.state, m.stats, m.reasoning,
             [(r.name, r.ext, r.tokens, store.image_path(r).read_bytes()) for r in m.images])
            for m in store.messages(c.id)
        ]  # fmt: skip
        out.append((c.title, msgs))
    return out


def test_json_round_trip_keeps_everything(store, tmp_path):
    ids = fill(store)
    path = chat_export.write_json(store, ids, tmp_path / "chats.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == "merlin-chats" and doc["version"] == 2
    thinking = doc["conversations"][1]["messages"][1]
    assert thinking["reasoning"] == REASONING and thinking["text"] == "2"
    assert "reasoning" not in doc["conversations"][0]["messages"][1]  # no thinking block
    other = Store(tmp_path / "other")
    try:
        new_ids = chat_export.import_conversations(other, read_json(path))
        assert len(new_ids) == 2
        assert sorted(snapshot(other)) == sorted(snapshot(store))
        # importing twice adds the chats again (a user's choice), never merges or replaces
        chat_export.import_conversations(other, read_json(path))
        assert len(other.conversations()) == 4
    finally:
        other.close()


def test_markdown_with_images_beside_it(store, tmp_path):
    a, _ = fill(store)
    md = chat_export.write_markdown(store, a, tmp_path / "out" / "shapes.md")
    text = md.read_text(encoding="utf-8")
    assert text.startswith("# Shapes\n")
    assert "## You" in text and "## Merlin" in text and "It is **red**." in text
    images = list((tmp_path / "out" / "shapes_images").iterdir())
    assert len(images) == 1 and images[0].read_bytes() == PNG
    assert f"](shapes_images/{images[0].name})" in text
    copied = chat_export.conversation_markdown(store, a)
    assert "[image: red_dot-" in copied and "What colour is the dot?" in copied
    assert "<details>" not in text  # no reasoning, no block


def test_markdown_folds_the_reasoning_and_shows_its_html_as_written(store, tmp_path):
    _, b = fill(store)
    text = chat_export.write_markdown(store, b, tmp_path / "sums.md").read_text("utf-8")
    assert text == chat_export.conversation_markdown(store, b)  # copy as Markdown: the same
    block, answer = text.split("## Merlin\n\n", 1)[1].split("</details>\n\n")
    assert block.startswith("<details>\n<summary>Thinking (12 s)</summary>\n\n> One plus")
    assert answer == "2\n"  # the answer after the block, without the reasoning
    quoted = block.split("</summary>\n\n", 1)[1].rstrip("\n").splitlines()
    assert all(line == ">" or line.startswith("> ") for line in quoted)  # plain text: a quote
    # a CommonMark reader (GitHub's dialect) folds it; tags, entities and escapes show as
    # written (Markdown in it renders as Markdown)
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").render(text)
    assert rendered.count("<details>") == rendered.count("</details>") == 1
    assert "<b>" not in rendered and "<i>" not in rendered and "<no tag>" not in rendered
    inside = rendered.split("</summary>", 1)[1].split("</details>", 1)[0]
    shown = html.unescape(re.sub(r"<[^>]+>", "", inside))
    assert " ".join(shown.split()) == " ".join(REASONING.replace("`", "").split())


def _doc(store, ids):
    return chat_export.export_json(store, ids)


def _write(tmp_path, obj, name="bad.json") -> str:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")
    return str(p)


def bad_documents(good: dict) -> dict:
    def edit(fn):
        d = json.loads(json.dumps(good))
        fn(d)
        return d

    msg = lambda d: d["conversations"][0]["messages"][0]  # noqa: E731
    img = lambda d: msg(d)["images"][0]  # noqa: E731
    return {
        "not ours": {"hello": 1},
        "a list": [1, 2],
        "newer version": edit(lambda d: d.update(version=99)),
        "version as text": edit(lambda d: d.update(version="1")),
        "no conversations": edit(lambda d: d.pop("conversations")),
        "unknown role": edit(lambda d: msg(d).update(role="system")),
        "text not a string": edit(lambda d: msg(d).update(text=5)),
        "unknown state": edit(lambda d: msg(d).update(state="weird")),
        "stats a list": edit(lambda d: msg(d).update(stats=[1])),
        "image data damaged": edit(lambda d: img(d).update(data=base64.b64encode(b"x").decode())),
        "image data not base64": edit(lambda d: img(d).update(data="***")),
        "image sha bad": edit(lambda d: img(d).update(sha256="zz")),
        "image ext path": edit(lambda d: img(d).update(ext="../../x")),
        "image without data": edit(lambda d: img(d).pop("data")),  # null: gone at export
        "image data a number": edit(lambda d: img(d).update(data=5)),
        "image tokens text": edit(lambda d: img(d).update(tokens="256")),
        "image tokens zero": edit(lambda d: img(d).update(tokens=0)),
        "image tokens true": edit(lambda d: img(d).update(tokens=True)),
        "image tokens huge": edit(lambda d: img(d).update(tokens=1 << 30)),
        "image tokens fractional": edit(lambda d: img(d).update(tokens=25.5)),
        "title huge": edit(lambda d: d["conversations"][0].update(title="t" * 5000)),
        "second chat bad": edit(lambda d: d["conversations"][1]["messages"].append({"role": 1})),
        "created NaN": edit(lambda d: d["conversations"][0].update(created=float("nan"))),
        "created huge": edit(lambda d: d["conversations"][0].update(created=10**400)),
        "created infinite": edit(lambda d: d["conversations"][0].update(created=float("inf"))),
        "created past 9999": edit(lambda d: d["conversations"][0].update(created=1e300)),
        "created negative": edit(lambda d: d["conversations"][0].update(created=-1)),
        "reasoning a number": edit(lambda d: reasoned(d).update(reasoning=3)),
        "reasoning of a question": edit(lambda d: msg(d).update(reasoning="hm")),
        "reasoning huge": edit(lambda d: reasoned(d).update(reasoning="r" * (9 << 20))),
    }


def reasoned(doc: dict) -> dict:
    return doc["conversations"][1]["messages"][1]


def test_bad_files_are_refused_and_nothing_changes(store, tmp_path):
    ids = fill(store)
    good = _doc(store, ids)
    before = snapshot(store)
    for name, doc in bad_documents(good).items():
        path = _write(tmp_path, doc)
        with pytest.raises(ChatFileError) as e:
            chat_export.import_conversations(store, read_json(path))
        assert str(e.value), name
        assert snapshot(store) == before, name


def test_numbers_too_big_to_read_are_refused_with_a_message(store, tmp_path):
    """A number Python will not read (over its int digit limit) or that no float holds is a
    ChatFileError saying what to do, never a raw ValueError or OverflowError."""
    good = json.dumps(_doc(store, fill(store)))
    long_version = good.replace('"version": 2', '"version": 1' + "0" * 5000)
    huge_created = re.sub(r'"created": [0-9.e+]+', '"created": 1' + "0" * 400, good, count=1)
    assert long_version != good and huge_created != good
    before = snapshot(store)
    with pytest.raises(ChatFileError, match="number thousands of digits long.*Choose a file"):
        read_json(_write(tmp_path, long_version))
    with pytest.raises(ChatFileError, match='chat 1: "created" must be a number of seconds'):
        read_json(_write(tmp_path, huge_created))
    assert snapshot(store) == before


def test_a_version_1_file_without_reasoning_still_imports(store, tmp_path):
    ids = fill(store)
    doc = _doc(store, ids)
    doc["version"] = 1
    for c in doc["conversations"]:
        for m in c["messages"]:
            m.pop("reasoning", None)
    convs = read_json(_write(tmp_path, doc, "v1.json"))
    new = chat_export.import_conversations(store, convs)
    rows = store.messages(new[1])
    assert [r.text for r in rows] == ["1+1?", "2"] and rows[1].reasoning is None
    assert rows[1].stats == {"thinking_s": 12.3}


def test_truncated_files_are_refused(store, tmp_path):
    ids = fill(store)
    text = json.dumps(_doc(store, ids))
    before = snapshot(store)
    for cut in range(0, len(text) - 1, max(1, len(text) // 40)):
        path = _write(tmp_path, text[:cut])
        with pytest.raises(ChatFileError, match="truncated|not a Merlin"):
            read_json(path)
    assert snapshot(store) == before


def test_enormous_directory_and_special_files_are_refused(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(chat_export.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ChatFileError, match="MB"):
        read_json(big)
    with pytest.raises(ChatFileError, match="not a regular file"):
        read_json(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ChatFileError, match="not a regular file"):
        read_json(fifo)  # refused at once, never blocks
    with pytest.raises(ChatFileError, match="cannot be read"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ChatFileError, match="UTF-8"):
        read_json(tmp_path / "bin.json")


def test_a_failing_transaction_imports_nothing(store, tmp_path, monkeypatch):
    ids = fill(store)
    convs = read_json(chat_export.write_json(store, ids, tmp_path / "c.json"))
    before = snapshot(store)
    real = store._db
    calls = {"n": 0}

    class Failing:
        def __getattr__(self, name):
            return getattr(real, name)

        def execute(self, sql, *args):
            if sql.startswith("INSERT INTO messages"):
                calls["n"] += 1
                if calls["n"] == 3:
                    raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    monkeypatch.setattr(store, "_db", Failing())
    with pytest.raises(Exception, match="could not be written|disk"):
        chat_export.import_conversations(store, convs)
    monkeypatch.setattr(store, "_db", real)
    assert snapshot(store) == before


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4)
        ),
        max_leaves=30,
    )
)
def test_any_json_is_imported_or_refused_with_a_message(tmp_path, value):
    doc = {"format": "merlin-chats", "version": 1, "conversations": value}
    try:
        convs = chat_export.parse_document(doc)
    except ChatFileError as e:
        assert str(e)
    else:
        assert isinstance(convs, list)


def test_lone_surrogates_and_a_bom_import(store, tmp_path):
    """A text escape of half a character (\\ud800) is imported as U+FFFD (the database cannot
    store it: a UnicodeEncodeError had escaped the import), and a file saved with a UTF-8 BOM
    (Windows editors) is read."""
    doc = (
        '{"format": "merlin-chats", "version": 2, "conversations": [{"title": "half \\ud800", '
        '"messages": [{"role": "user", "text": "hi \\udc00 there"}]}]}'
    )
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + doc.encode("ascii"))
    (cid,) = chat_export.import_conversations(store, read_json(path))
    assert store.conversation(cid).title == "half \ufffd"
    assert store.messages(cid)[0].text == "hi \ufffd there"


def test_a_backup_with_a_picture_gone_at_export_still_imports(store, tmp_path):
    """Export all wrote "data": null for a picture whose file was gone; the import refused the
    whole backup. Now that picture is left out and counted, and everything else imports."""
    ids = fill(store)
    ref = store.messages(ids[0])[0].images[0]
    store.image_path(ref).unlink()
    path = chat_export.write_json(store, ids, tmp_path / "all.json")
    convs = read_json(path)
    assert [m.missing_images for m in convs[0].messages] == [1, 1, 0]
    new = Store(tmp_path / "other")
    try:
        got = chat_export.import_conversations(new, convs)
        assert len(got) == 2 and new.conversation(got[0]).title == "Shapes"
        first = new.messages(got[0])
        assert first[0].text == "What colour is the dot?" and first[0].images == []
        assert new.messages(got[1])[-1].reasoning == REASONING
    finally:
        new.close()
    bad = json.loads(path.read_text(encoding="utf-8"))
    bad["conversations"][0]["messages"][0]["images"][0]["data"] = 5  # not ours: refused
    with pytest.raises(ChatFileError, match="must be base64 text"):
        read_json(_write(tmp_path, bad))


BAD_STATS = {
    "tokens": 12,
    "tokens_per_s": "12.5",
    "notices": [1, 2],
    "thinking_s": "3 s",
    "drafted": [[0, "x"]],
    "token_ids": "1 2",
    "reason": "context_full",
    "from_a_newer_merlin": {"kept": True},
}


def test_stats_of_the_wrong_kind_are_left_out_at_import(store, tmp_path):
    """An answer's figures of a kind the app cannot show (a text where a number goes) had
    been imported as they were, and opening that chat raised; they are left out, the rest
    kept (a key this Merlin does not read too)."""
    doc = {
        "format": "merlin-chats",
        "version": 2,
        "conversations": [
            {
                "title": "odd figures",
                "messages": [
                    {"role": "user", "text": "hi"},
                    {"role": "assistant", "text": "hello", "stats": BAD_STATS},
                ],
            }
        ],
    }
    (cid,) = chat_export.import_conversations(store, read_json(_write(tmp_path, doc)))
    stats = store.messages(cid)[1].stats
    assert stats == {"tokens": 12, "reason": "context_full", "from_a_newer_merlin": {"kept": True}}
    raw = store._db.execute("SELECT stats FROM messages WHERE role = 'assistant'").fetchone()[0]
    assert "12.5" not in raw  # not stored either


def test_stored_stats_of_the_wrong_kind_are_read_as_left_out(store):
    """The same figures written into the database by hand (or a newer Merlin) read back
    without them."""
    cid = store.create_conversation("chat")
    mid = store.add_message(cid, "assistant", "a")
    store._db.execute("UPDATE messages SET stats = ? WHERE id = ?", (json.dumps(BAD_STATS), mid))
    assert store.messages(cid)[0].stats["tokens"] == 12
    assert set(store.messages(cid)[0].stats) == {"tokens", "reason", "from_a_newer_merlin"}


def test_copy_conversations_keeps_order_states_switches_and_pictures(tmp_path):
    """What "Start a new chat history" moves from the store in memory: the list's order, a
    message still waiting for the model (not made "interrupted" as an import does), each
    chat's thinking switch, and the pictures."""
    import time

    source = Store(None)
    older = source.create_conversation("older chat")
    source.add_message(older, "user", "q1")
    time.sleep(0.01)
    newer = source.create_conversation("newer chat")
    source.set_thinking(newer, "off")
    picture = source.import_image_bytes(PNG, "png", "dot.png")
    source.add_message(newer, "user", "look", [picture])
    source.add_message(newer, "user", "sent while the model loads", state="queued")
    target = Store(tmp_path / "data")
    ids = chat_export.copy_conversations(source, target)
    assert [c.title for c in target.conversations()] == ["newer chat", "older chat"]
    assert target.thinking(ids[newer]) == "off" and target.thinking(ids[older]) is None
    rows = target.messages(ids[newer])
    assert [(r.text, r.state) for r in rows] == [
        ("look", "done"),
        ("sent while the model loads", "queued"),
    ]
    assert target.image_path(rows[0].images[0]).read_bytes() == PNG
    assert chat_export.copy_conversations(Store(None), target) == {}
    source.close()
    target.close()
