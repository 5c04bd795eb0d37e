"""The unsent message's file (app/model/draft.py): written whole or not at all, removed when
empty, never an exception for a folder that cannot be written or a file that is not ours;
its pictures are spared by the store's collection of unused images."""

import json
import os
import time

from merlin.app.model.draft import (
    DRAFT_FILE,
    LEGACY_DRAFT_FILE,
    Draft,
    DraftImage,
    draft_image_files,
    load_draft,
    save_draft,
)
from merlin.app.model.store import IMAGE_GRACE_S, Store


def test_a_draft_is_kept_replaced_and_removed(tmp_path):
    assert load_draft(tmp_path) == Draft()
    assert save_draft(tmp_path, Draft("first 你好\nline two"))
    assert load_draft(tmp_path).text == "first 你好\nline two"
    picture = DraftImage("ab12" * 16, "png", "cat 猫.png", "/home/u/cat.png", "fast")
    assert save_draft(tmp_path, Draft("", [picture]))  # pictures alone are a draft
    assert load_draft(tmp_path) == Draft("", [picture])
    assert sorted(os.listdir(tmp_path)) == [DRAFT_FILE]  # no temporary file left
    assert save_draft(tmp_path, Draft("   \n"))
    assert not (tmp_path / DRAFT_FILE).exists()


def test_the_text_only_draft_of_earlier_versions_is_read_then_superseded(tmp_path):
    (tmp_path / LEGACY_DRAFT_FILE).write_text("from before", encoding="utf-8")
    assert load_draft(tmp_path) == Draft("from before")
    assert save_draft(tmp_path, Draft("now"))
    assert sorted(os.listdir(tmp_path)) == [DRAFT_FILE]
    assert load_draft(tmp_path).text == "now"


def test_a_folder_that_cannot_be_written_or_a_damaged_file_is_no_error(tmp_path):
    missing = tmp_path / "not-there"
    assert save_draft(missing, Draft("text")) is False
    (tmp_path / DRAFT_FILE).mkdir()  # a folder where the file should be
    assert load_draft(tmp_path) == Draft()
    assert save_draft(tmp_path, Draft("text")) is False
    other = tmp_path / "other"
    other.mkdir()
    for junk in ("{not json", "[1, 2]", '"text"', "\x00\xff"):
        (other / DRAFT_FILE).write_text(junk, encoding="utf-8", errors="surrogateescape")
        assert load_draft(other) == Draft()
    # unusable picture entries are left out, the rest kept; a name that is not a store file
    # (a path out of the image folder) is never taken for one
    good = {"sha256": "c0ffee", "ext": "jpg", "name": "n", "path": "/p", "detail": ""}
    bad = [dict(good, sha256="../../etc/passwd"), dict(good, ext="png/../x"), dict(good, name=3),
           "string", dict(good, detail=None)]  # fmt: skip
    (other / DRAFT_FILE).write_text(json.dumps({"text": 5, "images": [*bad, good]}))
    assert load_draft(other) == Draft("", [DraftImage(**good)])
    assert draft_image_files(other) == {"c0ffee.jpg"}
    # nesting past Python's recursion limit; a lone surrogate (JSON allows it, UTF-8 not)
    (other / DRAFT_FILE).write_text("[" * 100_000)
    assert load_draft(other) == Draft() and draft_image_files(other) is None
    lone = {"text": "a\ud800b", "images": [dict(good, name="x\ud800")]}
    (other / DRAFT_FILE).write_text(json.dumps(lone))
    assert load_draft(other) == Draft("a?b")
    assert save_draft(other, Draft("typed \ud800 你好", [DraftImage(**good)]))  # no exception
    assert load_draft(other) == Draft("typed ? 你好", [DraftImage(**good)])


def test_the_stores_collection_spares_the_drafts_pictures(tmp_path):
    store = Store(tmp_path)
    try:
        kept = store.import_image_bytes(b"kept picture", "png", "a.png")
        dropped = store.import_image_bytes(b"dropped picture", "png", "b.png")
        old = time.time() - 2 * IMAGE_GRACE_S
        for ref in (kept, dropped):
            os.utime(store.image_path(ref), (old, old))
        save_draft(tmp_path, Draft("", [DraftImage(kept.sha256, kept.ext, "a.png", "/x/a.png")]))
        assert store.collect_images() == 1
        assert store.image_path(kept).is_file() and not store.image_path(dropped).exists()
        # a draft that cannot be read may name any picture: nothing is collected
        (tmp_path / DRAFT_FILE).write_text("{damaged")
        assert store.collect_images() == 0 and store.image_path(kept).is_file()
        save_draft(tmp_path, Draft())  # sent or removed: collected like any unused picture
        assert store.collect_images() == 1 and not store.image_path(kept).exists()
    finally:
        store.close()
