"""The chat store: schema, durability rules, recovery, images. Qt-free."""

import sqlite3

import pytest

from merlin.app.model import store_schema, store_sync
from merlin.app.model.store import DB_NAME, SCHEMA_VERSION, ImageRef, Store, StoreError


def test_conversation_roundtrip_and_search(tmp_path):
    store = Store(tmp_path)
    a = store.create_conversation("Boats")
    b = store.create_conversation("Cats")
    m1 = store.add_message(a, "user", "how many boats?")
    m2 = store.add_message(a, "assistant", "", state="streaming")
    store.update_message(m2, "two", state="done", stats={"tokens": 1})
    store.add_message(b, "user", "a cat 100% orange_ish")
    rows = store.messages(a)
    assert [(r.role, r.text, r.state) for r in rows] == [
        ("user", "how many boats?", "done"),
        ("assistant", "two", "done"),
    ]
    assert rows[1].stats == {"tokens": 1}
    assert [c.title for c in store.conversations()] == ["Cats", "Boats"]  # newest first
    assert [c.title for c in store.conversations("boats")] == ["Boats"]  # matches text too
    assert [c.title for c in store.conversations("100%")] == ["Cats"]  # LIKE escaped
    assert store.conversations("0%_") == []
    store.rename_conversation(a, "Lake")
    assert store.conversation(a).title == "Lake"
    assert store.delete_messages_from(a, m2) == 1
    assert [r.id for r in store.messages(a)] == [m1]
    store.delete_conversation(b)
    assert [c.id for c in store.conversations()] == [a]
    store.close()


def test_wal_commits_never_wait_for_the_disk_and_schema_version(tmp_path):
    store = Store(tmp_path)
    assert store.schema_version == SCHEMA_VERSION
    db = store._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # NORMAL: a commit does not fsync in the caller's (GUI) thread, nor does it checkpoint
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    store.close()


def test_commits_reach_the_disk_in_the_background(tmp_path, monkeypatch):
    """The syncer syncs the WAL after commits and checkpoints a large one into the database
    file: with every WAL 'large', after sync() the database file alone, without its WAL,
    holds every committed row."""
    monkeypatch.setattr(store_sync, "CHECKPOINT_BYTES", 0)
    store = Store(tmp_path)
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "sent")
    aid = store.add_message(cid, "assistant", "", state="streaming")
    for n in range(1, 20):
        store.update_message(aid, "word " * n)
    assert store.sync(timeout=30)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / DB_NAME).write_bytes((tmp_path / DB_NAME).read_bytes())  # no -wal file
    rows = Store(copy).messages(cid)
    assert [r.text for r in rows] == ["sent", "word " * 19]
    store.close()


def test_committed_message_survives_an_abandoned_connection(tmp_path):
    """What a crash leaves: the process dies without close(); committed rows are there."""
    store = Store(tmp_path)
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "sent before the crash")
    aid = store.add_message(cid, "assistant", "", state="streaming")
    store.update_message(aid, "half an ans")
    store._running.close()  # the process died: its locks go with it (not its connection)
    # no close(): a second connection (the next start) sees everything committed
    again = Store(tmp_path)
    rows = again.messages(cid)
    assert rows[0].text == "sent before the crash"
    assert rows[1].text == "half an ans" and rows[1].state == "interrupted"
    assert again.interrupted == 1


def test_a_second_merlin_leaves_the_first_ones_streaming_answer_alone(tmp_path):
    """A second Merlin on the same data folder had marked the first one's answer, still
    streaming, as interrupted ("Merlin was closed while answering")."""
    first = Store(tmp_path)
    cid = first.create_conversation("t")
    first.add_message(cid, "user", "a question")
    aid = first.add_message(cid, "assistant", "", state="streaming")
    first.update_message(aid, "half an ans")
    second = Store(tmp_path)
    assert second.interrupted == 0 and second.messages(cid)[1].state == "streaming"
    first.update_message(aid, "half an answer, done", state="done")
    first.close()
    assert second.messages(cid)[1].state == "done"
    aid2 = second.add_message(cid, "assistant", "", state="streaming")
    second._running.close()  # the second one dies mid-answer: the next start recovers it
    third = Store(tmp_path)
    assert third.interrupted == 1 and third.messages(cid)[-1].id == aid2
    assert third.messages(cid)[-1].state == "interrupted"
    third.close()


def test_images_are_content_addressed_and_collected(tmp_path):
    store = Store(tmp_path)
    src = tmp_path / "pic.png"
    src.write_bytes(b"\x89PNG fake bytes")
    ref = store.import_image(src)
    assert ref == store.import_image(src)  # same content, same file
    assert store.image_path(ref).read_bytes() == src.read_bytes()
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "look", [ref, ImageRef(ref.sha256, ref.ext, "again.png")])
    assert [i.name for i in store.messages(cid)[0].images] == ["pic.png", "again.png"]
    orphan = store.import_image_bytes(b"never used", "png", "orphan.png")
    assert store.collect_images() == 0  # just written: another Merlin may be committing it
    age(store.image_dir)
    assert store.collect_images() == 1
    assert not store.image_path(orphan).exists() and store.image_path(ref).exists()
    age(store.image_dir)
    store.delete_conversation(cid)
    assert not store.image_path(ref).exists()


ODD_EXTENSIONS = [("猫.ｐｎｇ", "png"), ("photo.jpé", "jp"), ("x.图片", "img")]


@pytest.mark.parametrize("name, ext", ODD_EXTENSIONS)
def test_a_picture_with_a_non_ascii_extension_stays_with_its_message(tmp_path, name, ext):
    """Its stored file had kept any Unicode letter of the extension, which the store does
    not read back: the picture vanished from the message sent, the chat and its exports."""
    store = Store(tmp_path)
    src = tmp_path / name
    src.write_bytes(b"\x89PNG fake bytes")
    ref = store.import_image(src)
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "look", [ref])
    (got,) = store.messages(cid)[0].images
    assert got.name == name and got.ext == ext
    assert store.image_path(got).read_bytes() == src.read_bytes()
    store.close()


def test_a_picture_stored_with_a_non_ascii_extension_by_an_older_merlin_is_shown(tmp_path):
    store = Store(tmp_path)
    ref = store.import_image_bytes(b"\x89PNG fake bytes", "png", "猫.ｐｎｇ")
    old = store.image_dir / f"{ref.sha256}.ｐｎｇ"  # as the older Merlin named it
    store.image_path(ref).rename(old)
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "look", [ImageRef(ref.sha256, "ｐｎｇ", "猫.ｐｎｇ")])
    (got,) = store.messages(cid)[0].images
    assert store.image_path(got) == old
    for bad in ("p/g", "p.g", "..", "p_g", "p\ng"):
        assert not store_schema.image_ref_ok(ref.sha256, bad)
    store.close()


def age(folder, seconds=3600.0):
    import os
    import time

    old = time.time() - seconds
    for p in folder.iterdir():
        os.utime(p, (old, old))


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_a_folder_in_place_of_the_database_or_its_logs_is_named(tmp_path, suffix):
    """SQLite reports a folder named chats.sqlite3-wal (or -shm, or the database itself) as a
    read-only data folder; the message names the entry to move instead, and nothing changes."""
    if suffix:
        store = Store(tmp_path)
        store.create_conversation("kept")
        store.close()
    blocker = tmp_path / f"{DB_NAME}{suffix}"
    blocker.mkdir()
    (blocker / "inside").write_text("the user's")
    with pytest.raises(StoreError) as e:
        Store(tmp_path)
    assert str(blocker) in str(e.value) and "is not a file" in str(e.value)
    assert "read-only" not in str(e.value)
    assert (blocker / "inside").read_text() == "the user's"
    blocker.joinpath("inside").unlink()
    blocker.rmdir()
    store = Store(tmp_path)
    assert [c.title for c in store.conversations()] == (["kept"] if suffix else [])
    store.close()


def test_held_image_collection_waits_for_the_last_release(tmp_path):
    """While an export reads pictures on another thread (hold_images), deleting the chat they
    belong to leaves them; the last release collects them."""
    store = Store(tmp_path)
    ref = store.import_image_bytes(b"a picture being exported", "png", "p.png")
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "look", [ref])
    age(store.image_dir)
    store.hold_images()
    store.hold_images()
    store.delete_conversation(cid)
    assert store.image_path(ref).exists()
    store.hold_images(False)
    assert store.collect_images() == 0 and store.image_path(ref).exists()
    store.hold_images(False)  # the last one
    assert not store.image_path(ref).exists()
    with pytest.raises(RuntimeError):
        store.hold_images(False)
    store.close()


def test_a_fresh_picture_of_a_deleted_chat_goes_at_the_next_start(tmp_path, monkeypatch):
    from merlin.app.model import store as store_module

    store = Store(tmp_path)
    ref = store.import_image_bytes(b"sent and deleted at once", "png", "p.png")
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "look", [ref])
    store.delete_conversation(cid)
    assert store.image_path(ref).exists()  # within the grace period
    store.close()
    monkeypatch.setattr(store_module, "IMAGE_GRACE_S", 0.0)  # ... which has passed
    again = Store(tmp_path)
    try:
        assert not again.image_path(ref).exists()
    finally:
        again.close()


def test_pictures_another_merlin_is_importing_are_spared(tmp_path):
    """One Merlin deletes a chat (collecting unused pictures) while another has written the
    pictures of an import and not yet committed its rows: those files stay (they had been
    deleted, leaving the imported messages without their pictures). A picture imported again
    (same content) counts as new too."""
    a, b = Store(tmp_path), Store(tmp_path)
    try:
        old = a.import_image_bytes(b"an old orphan", "png", "old.png")
        age(a.image_dir)
        fresh = b.import_image_bytes(b"being imported", "png", "new.png")  # rows not yet in
        again = b.import_image_bytes(b"an old orphan", "png", "again.png")  # reused: fresh
        cid = a.create_conversation("to delete")
        a.delete_conversation(cid)
        assert b.image_path(fresh).exists() and b.image_path(again).exists()
        c = b.create_conversation("imported")
        b.add_message(c, "user", "look", [fresh, again])
        assert [i.name for i in b.messages(c)[0].images] == ["new.png", "again.png"]
        age(a.image_dir)
        a.collect_images()
        assert a.image_path(fresh).exists()  # referenced now
        assert old == ImageRef(again.sha256, again.ext, "old.png")
    finally:
        a.close()
        b.close()


def test_newer_schema_is_refused_with_a_message(tmp_path):
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer Merlin"):
        Store(tmp_path)


def test_corrupt_database_is_refused_with_a_message(tmp_path):
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot be opened"):
        Store(tmp_path)


def test_in_memory_store_works(tmp_path):
    store = Store(None)
    cid = store.create_conversation("t")
    store.add_message(cid, "user", "x")
    assert store.messages(cid)[0].text == "x"


OPEN_AND_WRITE = """
import sys
from merlin.app.model.store import Store
s = Store(sys.argv[1])
s.add_message(s.create_conversation(sys.argv[2]), "user", "from " + sys.argv[2])
s.close()
print("ok")
"""


def test_two_merlins_opening_one_new_data_folder_both_save(tmp_path):
    """Both set up the new database at once: one had failed ('duplicate column name' from a
    migration the other had just done, or 'database is locked') and kept its chats in memory
    only, so everything it was told was lost."""
    import subprocess
    import sys

    for round_ in range(12):
        folder = tmp_path / f"d{round_}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_AND_WRITE, str(folder), name],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("a", "b", "c", "d")
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 and out.strip() == "ok" for p, (out, _) in zip(procs, outs)), (
            outs
        )
        s = Store(folder)
        assert sorted(r.title for r in s.conversations()) == ["a", "b", "c", "d"]
        assert s.schema_version == SCHEMA_VERSION
        s.close()


def test_damaged_page_is_refused_at_open(tmp_path):
    """A page of the database overwritten (disk damage): refused when opening, with the
    offer of a new history, never a DatabaseError out of a later read (that aborted the app
    at every start)."""
    import os

    s = Store(tmp_path)
    for i in range(50):
        s.add_message(s.create_conversation(f"chat {i}"), "user", "x" * 500)
    s.close()
    path = tmp_path / DB_NAME
    assert (
        not (tmp_path / f"{DB_NAME}-wal").exists()
        or (tmp_path / f"{DB_NAME}-wal").stat().st_size == 0
    )
    data = bytearray(path.read_bytes())
    data[4096:8192] = os.urandom(4096)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="cannot be opened") as e:
        Store(tmp_path)
    assert e.value.can_start_new
    assert path.read_bytes() == bytes(data)  # left as it is


def test_the_shown_messages_are_read_again_only_after_a_change(tmp_path):
    """messages() keeps its last answer while nothing was written, by this Store or by
    another connection (another Merlin on the same data folder)."""
    store = Store(tmp_path)
    cid = store.create_conversation("c")
    store.add_message(cid, "user", "one")
    reads = []
    real = store._read_messages
    store._read_messages = lambda c: reads.append(c) or real(c)
    first = store.messages(cid)
    assert [r.text for r in store.messages(cid)] == ["one"] and len(reads) == 1
    assert store.messages(cid) == first and store.messages(cid) is not first  # a new list
    store.add_message(cid, "assistant", "two")
    assert [r.text for r in store.messages(cid)] == ["one", "two"] and len(reads) == 2
    other = sqlite3.connect(tmp_path / DB_NAME)
    other.execute("UPDATE messages SET text = 'uno' WHERE text = 'one'")
    other.commit()
    other.close()
    assert [r.text for r in store.messages(cid)] == ["uno", "two"] and len(reads) == 3
    assert store.messages(cid + 1) == [] and len(reads) == 4
    store.close()
