"""`merlin-cli chat --session FILE` never overwrites a turn another run saved: a session file that
changed since this run loaded or last saved it is kept as it is, and this run's conversation
goes to a new file beside it (named on stderr), where its later turns are saved too.

The other run is simulated between this run's loading and saving: a real Session saved to the
same file, as a second `merlin-cli chat` would.
"""

from __future__ import annotations

import io
import shutil
import sys

import pytest

from merlin.engine import cli
from merlin.engine.commands import chat as chat_command
from merlin.engine.session import Session


class _Stdin:
    """Turns for the chat, with `before(i)` run just before turn i is read (after the session
    file was loaded, before this run saves)."""

    def __init__(self, lines, before=None):
        self.lines, self.before = lines, before or (lambda i: None)

    def __iter__(self):
        for i, line in enumerate(self.lines):
            self.before(i)
            yield line + "\n"


def _chat(monkeypatch, capsys, model, path, lines, before=None) -> tuple[int, str]:
    monkeypatch.setattr(chat_command, "load", lambda args: model)
    monkeypatch.setattr(sys, "stdin", _Stdin(lines, before))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    code = cli.main(["chat", "--session", str(path), "--max-new-tokens", "2"])
    return code, capsys.readouterr().err


def _questions(model, path) -> list[str]:
    s, result = Session.open(model, path)
    assert result.messages_loaded, result.reason
    return [m.text for m in s.messages if m.role == "user"]


def _other_run_saves(model, path, question: str) -> None:
    s, _ = Session.open(model, path)
    for _ in s.ask(question, max_new_tokens=2):
        pass
    s.save(path)


def test_runs_one_after_another_continue_the_same_file(demo_model, tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.mss"
    assert _chat(monkeypatch, capsys, demo_model, path, ["first"])[0] == 0
    code, err = _chat(monkeypatch, capsys, demo_model, path, ["second", "third"])
    assert code == 0 and "warning" not in err
    assert _questions(demo_model, path) == ["first", "second", "third"]
    assert [p.name for p in tmp_path.iterdir()] == ["c.mss"]


def test_a_turn_saved_by_another_run_is_never_overwritten(
    demo_model, tmp_path, monkeypatch, capsys
):
    path = tmp_path / "c.mss"
    assert _chat(monkeypatch, capsys, demo_model, path, ["first"])[0] == 0

    def other_run(i):  # run A saves its turn after this run (B) loaded the file
        if i == 0:
            _other_run_saves(demo_model, path, "A's turn")

    code, err = _chat(monkeypatch, capsys, demo_model, path, ["B's turn", "B again"], other_run)
    beside = tmp_path / "c (2).mss"
    assert code == 0
    assert _questions(demo_model, path) == ["first", "A's turn"]  # A's turn is kept
    assert _questions(demo_model, beside) == ["first", "B's turn", "B again"]  # so is B's
    assert err.count("not overwritten") == 1 and f"saved to {beside}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c (2).mss", "c.mss"]


def test_a_file_made_meanwhile_is_kept_and_names_in_use_are_skipped(
    demo_model, tmp_path, monkeypatch, capsys
):
    path = tmp_path / "c.mss"
    taken = tmp_path / "c (2).mss"
    assert _chat(monkeypatch, capsys, demo_model, taken, ["other chat"])[0] == 0
    before = taken.read_bytes()

    def other_run(i):  # creates the file this run found absent
        if i == 0:
            shutil.copyfile(taken, path)

    code, err = _chat(monkeypatch, capsys, demo_model, path, ["mine"], other_run)
    assert code == 0 and "c (3).mss" in err
    assert path.read_bytes() == before and taken.read_bytes() == before
    assert _questions(demo_model, tmp_path / "c (3).mss") == ["mine"]


@pytest.mark.parametrize(
    "name, beside", [("c", "c (2)"), ("c.d.mss", "c.d (2).mss"), (".mss", ".mss (2)")]
)
def test_the_new_name_keeps_the_extension(tmp_path, name, beside):
    (tmp_path / name).write_bytes(b"x")
    assert chat_command._free_name(tmp_path / name) == tmp_path / beside


def test_a_picture_attached_before_regenerate_waits_for_the_next_question(
    demo_model, tmp_path, monkeypatch, capsys
):
    """`/image` then `/regenerate`: the picture had been dropped without a word (exit 0);
    it now goes with the next question, and the user is told."""
    from PIL import Image

    picture = tmp_path / "pic.png"
    Image.new("RGB", (64, 48), "red").save(picture)
    path = tmp_path / "c.mss"
    lines = ["first", f"/image {picture}", "/regenerate", "what is in it?"]
    code, err = _chat(monkeypatch, capsys, demo_model, path, lines)
    assert code == 0 and "wait for your next question" in err, err
    s, result = Session.open(demo_model, path)
    assert result.messages_loaded, result.reason
    users = [m for m in s.messages if m.role == "user"]
    assert [m.text for m in users] == ["first", "what is in it?"]
    assert [len(m.images) for m in users] == [0, 1]


def test_a_picture_given_by_a_relative_path_is_found_from_another_folder(
    demo_model, tmp_path, monkeypatch, capsys
):
    """`/image pic.png` kept as given: a later run started in another folder took it for a
    file that is gone (or read another pic.png there)."""
    from PIL import Image

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    Image.new("RGB", (64, 48), "red").save(first / "pic.png")
    path = tmp_path / "c.mss"
    monkeypatch.chdir(first)
    assert _chat(monkeypatch, capsys, demo_model, path, ["/image pic.png", "what is it?"])[0] == 0
    s, _ = Session.open(demo_model, path)
    assert s.messages[0].images[0].source == str(first / "pic.png")
    monkeypatch.chdir(second)
    code, err = _chat(monkeypatch, capsys, demo_model, path, ["and its colour?"])
    assert code == 0 and "error" not in err, err


def test_a_session_whose_conversation_cannot_be_read_is_refused_and_kept(
    demo_model, tmp_path, monkeypatch, capsys
):
    """A file whose container and format are fine but whose messages this Merlin cannot read
    (here an index out of range in its list of dropped messages, checksums valid) had been
    replaced by the new run's first turn, losing the chat: it is refused with exit 2 and
    kept byte for byte."""
    from merlin.engine import arrayfile
    from merlin.engine.session import SESSION_KIND

    path = tmp_path / "c.mss"
    assert _chat(monkeypatch, capsys, demo_model, path, ["first", "second"])[0] == 0
    with arrayfile.Reader(path, SESSION_KIND) as r:
        arrays = [arrayfile.array_spec(n, r.read(n)) for n in r.entries]
        meta = dict(r.meta, dropped=[99])
    arrayfile.write(path, SESSION_KIND, meta, arrays)
    before = path.read_bytes()
    code, err = _chat(monkeypatch, capsys, demo_model, path, ["hello"])
    assert code == 2 and "cannot be read" in err and "not changed" in err
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.mss"]


def test_a_picture_pasted_as_a_terminal_pastes_a_dragged_file(
    demo_model, tmp_path, monkeypatch, capsys
):
    """A file dragged into a terminal comes as a quoted path, an escaped one or a file://
    URL; each had been glued to the current folder ("no such file", exit 2)."""
    from PIL import Image

    picture = tmp_path / "my photo.png"
    Image.new("RGB", (64, 48), "red").save(picture)
    url = "file://" + str(picture).replace(" ", "%20")
    for typed in (f"'{picture}'", f'"{picture}"', str(picture).replace(" ", "\\ "), url):
        path = tmp_path / "c.mss"
        path.unlink(missing_ok=True)
        code, err = _chat(monkeypatch, capsys, demo_model, path, [f"/image {typed}", "what?"])
        assert code == 0 and "error" not in err, (typed, err)
        s, _ = Session.open(demo_model, path)
        assert s.messages[0].images[0].source == str(picture), typed


def test_a_session_that_could_not_be_saved_is_the_exit_status(
    demo_model, tmp_path, monkeypatch, capsys
):
    """A full disk or a folder that cannot be written warned after every turn and exited 0:
    a script could not tell that the file was never written."""
    from merlin.engine import arrayfile

    def full(*args, **kwargs):
        raise arrayfile.FileSaveError("the disk is full")

    monkeypatch.setattr(Session, "save", full)
    code, err = _chat(monkeypatch, capsys, demo_model, tmp_path / "c.mss", ["first"])
    assert code == 2 and "the session was not saved: the disk is full" in err
