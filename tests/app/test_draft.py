"""The unsent message's files (app/model/draft.py): each window's written whole or not at
all, removed when empty, locked while its window runs and taken over by the next start once
it is gone; never an exception for a folder that cannot be written or a file that is not
ours; their pictures are spared by the store's collection of unused images."""

import json
import os
import time

import pytest
from gui_helpers import drafts_on_disk

from merlin.app.model import draft as draft_module
from merlin.app.model.draft import (
    DRAFTS_DIR,
    Draft,
    DraftImage,
    DraftKeeper,
    draft_image_files,
    read_draft_file,
    write_draft_file,
)
from merlin.app.model.store import IMAGE_GRACE_S, Store

PICTURE = DraftImage("ab12" * 16, "png", "cat 猫.png", "/home/u/cat.png", "fast")


def test_a_draft_file_is_kept_replaced_and_removed(tmp_path):
    path = tmp_path / "d.json"
    assert read_draft_file(path) == Draft()
    write_draft_file(path, Draft("first 你好\nline two"))
    assert read_draft_file(path).text == "first 你好\nline two"
    write_draft_file(path, Draft("", [PICTURE]))  # pictures alone are a draft
    assert read_draft_file(path) == Draft("", [PICTURE])
    assert sorted(os.listdir(tmp_path)) == ["d.json"]  # no temporary file left
    write_draft_file(path, Draft("   \n"))
    assert not path.exists()


def test_a_window_takes_over_the_drafts_of_windows_that_are_gone(tmp_path):
    """Two windows on one data folder keep a draft each; a third, started while they run,
    takes neither; once they are gone (closed, or their process died: the lock is freed),
    the next start gets both, merged, and its first save removes them."""
    a, b = DraftKeeper(tmp_path), DraftKeeper(tmp_path)
    assert a.take_over() == Draft() and b.take_over() == Draft()
    assert a.save(Draft("from A", [PICTURE])) and b.save(Draft("from B"))
    assert a.save(Draft("from A, more", [PICTURE]))  # each its own file: B's stays
    both = Draft("from B\n\nfrom A, more", [PICTURE])
    assert drafts_on_disk(tmp_path) == both
    third = DraftKeeper(tmp_path)
    assert third.take_over() == Draft()  # both windows still run
    a.close()
    b._lock.close()  # as if B's process died: its lock is freed, its file stays
    fourth = DraftKeeper(tmp_path)
    assert fourth.take_over() == both
    fifth = DraftKeeper(tmp_path)
    assert fifth.take_over() == Draft()  # taken: not twice
    assert fourth.save(Draft("mine now"))
    assert drafts_on_disk(tmp_path) == Draft("mine now")
    for keeper in (third, fourth, fifth):
        keeper.close()
    left = sorted(os.listdir(tmp_path / DRAFTS_DIR))
    assert left == sorted([fourth.path.name, f"{fourth.path.stem}.lock"])
    # a window that died with nothing written leaves a lock file alone: the next start
    # removes it
    dead = DraftKeeper(tmp_path)
    dead._lock.close()
    last = DraftKeeper(tmp_path)
    assert last.take_over() == Draft("mine now")
    assert not (tmp_path / DRAFTS_DIR / f"{dead.path.stem}.lock").exists()
    last.close()


def test_the_one_draft_of_earlier_versions_is_taken_over(tmp_path):
    (tmp_path / "draft.txt").write_text("from session 26", encoding="utf-8")
    write_draft_file(tmp_path / "draft.json", Draft("from before", [PICTURE]))
    keeper = DraftKeeper(tmp_path)
    assert keeper.take_over() == Draft("from before\n\nfrom session 26", [PICTURE])
    assert keeper.save(Draft("now"))
    assert not (tmp_path / "draft.txt").exists() and not (tmp_path / "draft.json").exists()
    keeper.close()


def test_a_folder_that_cannot_be_written_or_a_damaged_file_is_no_error(tmp_path):
    import shutil

    keeper = DraftKeeper(tmp_path / "one")
    shutil.rmtree(tmp_path / "one" / DRAFTS_DIR)
    (tmp_path / "one" / DRAFTS_DIR).write_text("a file where the folder was")
    assert keeper.save(Draft("text")) is False  # logged, no exception
    keeper.close()
    (tmp_path / "file").touch()
    with pytest.raises(OSError):
        DraftKeeper(tmp_path / "file")  # the window goes on without a draft on disk
    other = tmp_path / "other.json"
    for junk in ("{not json", "[1, 2]", '"text"', "\x00\xff", "[" * 100_000):
        other.write_text(junk, encoding="utf-8", errors="surrogateescape")
        with pytest.raises(draft_module.DraftUnreadable):
            read_draft_file(other)
    # unusable picture entries are left out, the rest kept; a name that is not a store file
    # (a path out of the image folder) is never taken for one
    good = {"sha256": "c0ffee", "ext": "jpg", "name": "n", "path": "/p", "detail": ""}
    bad = [dict(good, sha256="../../etc/passwd"), dict(good, ext="png/../x"), dict(good, name=3),
           "string", dict(good, detail=None), dict(good, name="x\ud800")]  # fmt: skip
    other.write_text(json.dumps({"text": "a\ud800b", "images": [*bad, good]}))
    assert read_draft_file(other) == Draft("a?b", [DraftImage(**good)])
    write_draft_file(other, Draft("typed \ud800 你好"))  # no exception: \u escapes
    assert read_draft_file(other) == Draft("typed ? 你好")
    # a damaged draft among others: the rest are still taken over, the damaged one left
    (tmp_path / DRAFTS_DIR).mkdir()
    damaged = tmp_path / DRAFTS_DIR / "damaged.json"
    damaged.write_text("[" * 100_000)
    write_draft_file(tmp_path / DRAFTS_DIR / "fine.json", Draft("fine"))
    assert DraftKeeper(tmp_path).take_over() == Draft("fine")
    assert damaged.exists() and draft_image_files(tmp_path) is None


def test_the_stores_collection_spares_every_drafts_pictures(tmp_path):
    store = Store(tmp_path)
    try:
        refs = [store.import_image_bytes(f"picture {i}".encode(), "png", f"{i}.png")
                for i in range(3)]  # fmt: skip
        old = time.time() - 2 * IMAGE_GRACE_S
        for ref in refs:
            os.utime(store.image_path(ref), (old, old))
        a, b = DraftKeeper(tmp_path), DraftKeeper(tmp_path)
        a.save(Draft("", [DraftImage(refs[0].sha256, refs[0].ext, "0.png", "/x/0.png")]))
        b.save(Draft("", [DraftImage(refs[1].sha256, refs[1].ext, "1.png", "/x/1.png")]))
        assert draft_image_files(tmp_path) == {store.image_path(r).name for r in refs[:2]}
        assert store.collect_images() == 1  # only the picture no draft names
        assert all(store.image_path(r).is_file() for r in refs[:2])
        # a draft that cannot be read may name any picture: nothing is collected
        (tmp_path / DRAFTS_DIR / "damaged.json").write_text("{damaged")
        b.save(Draft())
        assert store.collect_images() == 0 and store.image_path(refs[1]).is_file()
        (tmp_path / DRAFTS_DIR / "damaged.json").unlink()
        assert store.collect_images() == 1 and not store.image_path(refs[1]).exists()
        assert store.image_path(refs[0]).is_file()
    finally:
        store.close()


def test_drafts_too_long_to_merge_wait_for_a_later_start(tmp_path, monkeypatch):
    """Two windows that died left a draft each, together over the limit: merged and cut,
    the rest of the second was deleted at the first save. Now the one that does not fit
    stays on disk for a later start."""
    monkeypatch.setattr(draft_module, "MAX_DRAFT_CHARS", 1000)
    for letter in ("x", "y"):
        keeper = DraftKeeper(tmp_path)
        assert keeper.save(Draft(letter * 600 + " END"))
        keeper._lock.close()  # its process died
    first = DraftKeeper(tmp_path)
    got = first.take_over()
    assert len(got.text) == 604 and got.text.endswith(" END")
    assert first.save(got)
    second = DraftKeeper(tmp_path)
    other = second.take_over()
    assert other.text.endswith(" END") and other.text[0] != got.text[0]  # the other one


def test_a_long_draft_is_kept_whole(tmp_path):
    text = "a line of an essay pasted in\n" * 50_000  # 1.5 million characters
    keeper = DraftKeeper(tmp_path)
    assert keeper.save(Draft(text))
    keeper.close()
    assert DraftKeeper(tmp_path).take_over().text == text.strip("\n")


def test_drafts_with_more_pictures_than_the_box_takes_wait_too(tmp_path):
    pictures = [DraftImage(f"{i:064x}", "png", f"{i}.png", f"/p/{i}.png") for i in range(10)]
    for part in (pictures[:5], pictures[5:]):
        keeper = DraftKeeper(tmp_path)
        assert keeper.save(Draft("", part))
        keeper._lock.close()
    first = DraftKeeper(tmp_path)
    assert len(first.take_over(max_images=8).images) == 5
    assert first.save(Draft("mine"))
    assert len(DraftKeeper(tmp_path).take_over(max_images=8).images) == 5


def test_a_picture_whose_path_is_not_utf8_stays_in_the_draft(tmp_path):
    """A file named by bytes that are not UTF-8 is a str with surrogate escapes: its draft
    entry had been dropped as unreadable."""
    picture = DraftImage(
        "ab12" * 16, "png", "bad\ufffdname.png", os.fsdecode(b"/p/bad\xffname.png")
    )
    write_draft_file(tmp_path / "d.json", Draft("", [picture]))
    assert read_draft_file(tmp_path / "d.json").images == [picture]
