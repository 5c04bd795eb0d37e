"""The unsent text's file (app/model/draft.py): written whole or not at all, removed when
empty, never an exception for a folder that cannot be written."""

import os

from merlin.app.model.draft import DRAFT_FILE, load_draft, save_draft


def test_a_draft_is_kept_replaced_and_removed(tmp_path):
    assert load_draft(tmp_path) == ""
    assert save_draft(tmp_path, "first 你好\nline two")
    assert load_draft(tmp_path) == "first 你好\nline two"
    assert save_draft(tmp_path, "second")
    assert load_draft(tmp_path) == "second"
    assert sorted(os.listdir(tmp_path)) == [DRAFT_FILE]  # no temporary file left
    assert save_draft(tmp_path, "   \n")
    assert not (tmp_path / DRAFT_FILE).exists()


def test_a_folder_that_cannot_be_written_is_no_error(tmp_path):
    missing = tmp_path / "not-there"
    assert save_draft(missing, "text") is False
    (tmp_path / DRAFT_FILE).mkdir()  # a folder where the file should be
    assert load_draft(tmp_path) == ""
    assert save_draft(tmp_path, "text") is False
