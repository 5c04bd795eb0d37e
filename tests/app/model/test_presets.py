"""System-prompt presets: shipped ones, the user's own saved atomically, a file that cannot be
read never written over; and the Settings dialog's preset row."""

import json

import pytest
from gui_helpers import data_dir  # noqa: F401 (fixture)

from merlin.app.model.presets import SHIPPED, PresetError, Presets


def test_shipped_and_own_presets(tmp_path):
    p = Presets(tmp_path)
    assert p.names()[: len(SHIPPED)] == list(SHIPPED) and p.prompt("Default") == ""
    p.save("Pirate", "Talk like a pirate.")
    again = Presets(tmp_path)
    assert again.prompt("Pirate") == "Talk like a pirate." and again.is_user("Pirate")
    again.save("Concise", "my own concise")  # a user's preset may take a shipped name
    assert Presets(tmp_path).prompt("Concise") == "my own concise"
    again.delete("Pirate")
    assert "Pirate" not in Presets(tmp_path).names()


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b'{"version": 9, "presets": {}}',
        b"[1, 2]",
        b"\xff\xfe",
        b'{"version": 1, "presets": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # too deep
    ],
)
def test_an_unreadable_file_is_never_written_over(tmp_path, content):
    (tmp_path / "presets.json").write_bytes(content)
    p = Presets(tmp_path)
    assert p.problem and p.names() == list(SHIPPED)
    with pytest.raises(PresetError, match="left as it is"):
        p.save("x", "y")
    assert (tmp_path / "presets.json").read_bytes() == content


def test_a_lone_surrogate_in_a_preset_never_stops_saving(tmp_path):
    """A JSON escape of half a character (\\ud800) loads as U+FFFD; saving then works (it had
    raised UnicodeEncodeError, no PresetError)."""
    (tmp_path / "presets.json").write_text(
        '{"version": 1, "presets": {"Half \\ud800": "a \\udc00 b"}}', encoding="utf-8"
    )
    p = Presets(tmp_path)
    assert not p.problem and p.prompt("Half \ufffd") == "a \ufffd b"
    p.save("new", "typed \ud800 too")
    again = Presets(tmp_path)
    assert again.prompt("new") == "typed \ufffd too" and "Half \ufffd" in again.names()


def test_bad_names_and_sizes(tmp_path):
    p = Presets(tmp_path)
    with pytest.raises(PresetError, match="name"):
        p.save("  ", "x")
    with pytest.raises(PresetError, match="characters"):
        p.save("n", "x" * 30_000)
    assert not (tmp_path / "presets.json").exists()


def test_settings_dialog_preset_row(qtbot, data_dir):
    from merlin.app.settings import AppSettings, SettingsDialog

    dialog = SettingsDialog(AppSettings(language="en"))
    qtbot.addWidget(dialog)
    picker = dialog.preset
    idx = picker.combo.findData("Concise")
    picker.combo.setCurrentIndex(idx)
    picker.combo.activated.emit(idx)
    assert dialog.system_prompt.toPlainText() == SHIPPED["Concise"]
    assert not picker.delete_button.isEnabled()  # shipped presets cannot be deleted
    dialog.system_prompt.setPlainText("Only haiku.")
    assert picker.save_as("Haiku")
    assert picker.combo.currentData() == "Haiku" and picker.delete_button.isEnabled()
    assert dialog.result_settings().system_prompt == "Only haiku."
    saved = json.loads((data_dir / "presets.json").read_text("utf-8"))
    assert saved["presets"] == {"Haiku": "Only haiku."}
    picker.delete_current()
    assert picker.combo.findData("Haiku") == -1
