"""file_lock.try_lock: held by one open file at a time, and never a lock on a file no longer
at its path (its holder removed it between our open and our lock)."""

from merlin.app.model import file_lock
from merlin.app.model.file_lock import try_lock


def test_one_holder_at_a_time(tmp_path):
    first = try_lock(tmp_path / "x.lock")
    assert first is not None and try_lock(tmp_path / "x.lock") is None
    first.close()
    assert try_lock(tmp_path / "x.lock") is not None


def test_a_file_removed_before_it_was_locked_is_not_taken_for_it(tmp_path, monkeypatch):
    """A holder that finished (its marker removed, then its lock freed) between our open and
    our flock: the lock was on the removed file, and a third Merlin could lock the new one."""
    path = tmp_path / "x.lock"
    flock, calls = file_lock.fcntl.flock, []

    def holder_finishes_first(fd, operation):
        calls.append(fd)
        if len(calls) == 1:
            path.unlink()  # as the holder does before it lets go
        return flock(fd, operation)

    monkeypatch.setattr(file_lock.fcntl, "flock", holder_finishes_first)
    held = try_lock(path)
    assert held is not None and len(calls) == 2  # the second try locked the file at path
    monkeypatch.setattr(file_lock.fcntl, "flock", flock)
    assert path.exists() and try_lock(path) is None
    held.close()
