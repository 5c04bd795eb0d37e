"""Getting a model: a checkpoint downloaded from a local stand-in of the hub (HF_ENDPOINT
style), with progress, cancel, an interrupted transfer resumed, and a damaged file refused."""

from __future__ import annotations

import socket
import threading

import pytest
from fake_hub import FakeHub

from merlin.app.model import downloads
from merlin.app.model.downloads import Cancelled, DownloadError, download_checkpoint

REPO = "Qwen/Qwen3-VL-Tiny-Test"


@pytest.fixture
def files(demo_dir):
    """The demo checkpoint's files, as the hub would hold them (plus one it does not need)."""
    out = {p.name: p.read_bytes() for p in demo_dir.iterdir() if p.is_file()}
    out["README.md"] = b"# a model card\n"
    return out


def test_download_makes_a_loadable_folder(files, tmp_path, monkeypatch):
    from merlin.engine.config import load_config

    seen = []
    with FakeHub(REPO, files) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)  # a mirror, as a user in China sets it
        folder = download_checkpoint(REPO, tmp_path / "models", on_progress=seen.append)
    assert folder == tmp_path / "models" / "Qwen--Qwen3-VL-Tiny-Test"
    for name, data in files.items():
        if name != "README.md":
            assert (folder / name).read_bytes() == data
    assert not (folder / "README.md").exists()  # only what a checkpoint needs
    assert not downloads.is_incomplete(folder)
    assert seen and seen[-1].done_bytes == seen[-1].total_bytes > 0
    load_config(folder)


BIG = "model-00002-of-00002.safetensors"


@pytest.fixture
def big_files(files):
    """With a weights file larger than huggingface_hub's 10 MB transfer chunk, so that a
    dropped transfer leaves a partial file to resume from."""
    return dict(files, **{BIG: bytes(range(256)) * (100 * 1024)})  # 25 MB


def _ranges(hub, name):
    return [r for m, p, r in hub.requests if m == "GET" and p.endswith(name) and r]


def test_a_dropped_transfer_resumes_with_a_range_request(big_files, tmp_path):
    files, weights = big_files, BIG
    with FakeHub(REPO, files) as hub:
        hub.drop_after[weights] = 15 << 20
        folder = download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        ranges = _ranges(hub, weights)
    assert (folder / weights).read_bytes() == files[weights]
    assert ranges and ranges[-1] != "bytes=0-"  # only the rest was asked for again


def test_a_download_that_failed_resumes_on_the_next_try(big_files, tmp_path, monkeypatch):
    files, weights = big_files, BIG
    monkeypatch.setattr("time.sleep", lambda s: None)  # huggingface_hub's retry pauses
    with FakeHub(REPO, files) as hub:
        hub.drop_after[weights] = 12 << 20
        hub.down_after_drop = True  # and then the server is gone: this try fails
        with pytest.raises(DownloadError, match="resumes"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        assert downloads.is_incomplete(tmp_path / "Qwen--Qwen3-VL-Tiny-Test")
        hub.down = False
        hub.requests.clear()
        folder = download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        ranges = _ranges(hub, weights)
    assert (folder / weights).read_bytes() == files[weights]
    assert ranges and int(ranges[0].split("=")[1].rstrip("-")) > 0
    assert not downloads.is_incomplete(folder)


def test_damaged_file_is_refused_and_fetched_again(files, tmp_path):
    weights = next(n for n in files if n.endswith(".safetensors"))
    with FakeHub(REPO, files) as hub:
        hub.corrupt.add(weights)
        with pytest.raises(DownloadError, match="damaged"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        folder = tmp_path / "Qwen--Qwen3-VL-Tiny-Test"
        assert not (folder / weights).exists()
        hub.corrupt.clear()
        download_checkpoint(REPO, tmp_path, endpoint=hub.url)
    assert (folder / weights).read_bytes() == files[weights]


def test_cancel_stops_and_says_so(files, tmp_path):
    cancel = threading.Event()

    def progress(p):
        cancel.set()  # the user pressed Cancel after the first bytes arrived

    with FakeHub(REPO, files) as hub:
        with pytest.raises(Cancelled):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url, on_progress=progress,
                                cancel=cancel)  # fmt: skip
    assert downloads.is_incomplete(tmp_path / "Qwen--Qwen3-VL-Tiny-Test")


def test_unknown_repo_and_unreachable_hub_are_clear_errors(files, tmp_path):
    with FakeHub(REPO, files) as hub:
        with pytest.raises(DownloadError, match="not found"):
            download_checkpoint("Qwen/NoSuchModel", tmp_path, endpoint=hub.url)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(DownloadError, match="could not be reached"):
        download_checkpoint(REPO, tmp_path, endpoint=url)


def test_a_repo_without_weights_is_refused(tmp_path):
    with FakeHub(REPO, {"config.json": b"{}", "README.md": b"x"}) as hub:
        with pytest.raises(DownloadError, match="not a checkpoint"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)


def test_a_web_page_in_a_files_place_is_refused(files, tmp_path):
    """A mirror answering a small file with its error page (200, HTML) had made a folder
    called complete whose config.json was HTML."""
    with FakeHub(REPO, files) as hub:
        hub.error_page.add("config.json")
        with pytest.raises(DownloadError, match=r"config.json arrived as \d+ bytes .* web page"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        folder = tmp_path / "Qwen--Qwen3-VL-Tiny-Test"
        assert downloads.is_incomplete(folder) and not (folder / "config.json").exists()
        hub.error_page = {"api"}
        with pytest.raises(DownloadError, match="not as the Hugging Face hub does"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        hub.error_page.clear()
        assert download_checkpoint(REPO, tmp_path, endpoint=hub.url) == folder
    assert (folder / "config.json").read_bytes() == files["config.json"]


def test_a_second_download_of_the_same_model_is_told_not_run(files, tmp_path):
    """Two Merlins downloading one model wrote the same files: one folder was called complete
    with a tokenizer.json written twice."""
    from merlin.app.model.file_lock import try_lock

    folder = tmp_path / "Qwen--Qwen3-VL-Tiny-Test"
    folder.mkdir()
    other = try_lock(folder / downloads.MARKER)  # another Merlin's download, running
    with FakeHub(REPO, files) as hub:
        with pytest.raises(DownloadError, match="Another Merlin is downloading"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        assert [p.name for p in folder.iterdir()] == [downloads.MARKER]
        other.close()  # it stopped
        assert download_checkpoint(REPO, tmp_path, endpoint=hub.url) == folder
    assert not downloads.is_incomplete(folder)


def test_a_disk_without_room_is_said_before_anything_is_fetched(files, tmp_path, monkeypatch):
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda path: usage(1 << 30, 0, 1 << 20))
    with FakeHub(REPO, files) as hub:
        with pytest.raises(DownloadError, match="needs .* more on the disk .* 1.0 MB free"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        assert not [r for r in hub.requests if "/resolve/" in r[1]]  # nothing fetched


def test_a_cancel_keeps_what_arrived(files, tmp_path):
    """A cancel came at huggingface_hub's progress report, before the chunk it reported was
    written, and its chunks were 10 MB: at a slow link's speed a cancel waited most of a
    minute and the partial file kept nothing."""
    big = dict(files, **{"model-00002-of-00002.safetensors": bytes(range(256)) * (12 << 12)})
    cancel, seen = threading.Event(), []

    def progress(p):
        if p.file.startswith("model-00002"):
            seen.append(p.done_bytes)
            if seen[-1] - seen[0] > (1 << 20):
                cancel.set()

    with FakeHub(REPO, big) as hub:
        hub.slow = True
        with pytest.raises(Cancelled):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url, on_progress=progress,
                                cancel=cancel)  # fmt: skip
    part = tmp_path / "Qwen--Qwen3-VL-Tiny-Test" / ".model-00002-of-00002.safetensors.part"
    assert part.stat().st_size >= 1 << 20
    assert part.read_bytes() == big["model-00002-of-00002.safetensors"][: part.stat().st_size]


def test_a_json_file_that_is_a_web_page_is_refused_without_listed_sizes(files, tmp_path):
    with FakeHub(REPO, files) as hub:
        hub.sizes = False
        hub.error_page.add("config.json")
        with pytest.raises(DownloadError, match="config.json arrived as something other than"):
            download_checkpoint(REPO, tmp_path, endpoint=hub.url)


def test_downloads_run_where_files_cannot_be_locked(files, tmp_path, monkeypatch):
    """A models folder on a file system without locks (NFS without its lock daemon): every
    download had been refused as "another Merlin is downloading"."""
    import errno

    from merlin.app.model import file_lock

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(file_lock.fcntl, "flock", no_locks)
    with FakeHub(REPO, files) as hub:
        folder = download_checkpoint(REPO, tmp_path, endpoint=hub.url)
    assert not downloads.is_incomplete(folder)


def test_a_download_of_this_merlin_still_stopping_is_waited_for(files, tmp_path):
    """A cancelled transfer stops at its next chunk (or the network's timeout); starting the
    same model again in this Merlin had been refused as another Merlin's download."""
    import time

    target = (tmp_path / "Qwen--Qwen3-VL-Tiny-Test").resolve()
    with downloads._in_process_guard:
        stopping = downloads._in_process.setdefault(target, threading.Lock())
    stopping.acquire()
    threading.Timer(0.5, stopping.release).start()
    t = time.monotonic()
    with FakeHub(REPO, files) as hub:
        assert download_checkpoint(REPO, tmp_path, endpoint=hub.url) == target
    assert time.monotonic() - t >= 0.5


def test_nothing_left_to_fetch_needs_no_room(files, tmp_path, monkeypatch):
    import collections

    with FakeHub(REPO, files) as hub:
        folder = download_checkpoint(REPO, tmp_path, endpoint=hub.url)
        (folder / downloads.MARKER).write_text("as a Merlin that stopped before removing it\n")
        usage = collections.namedtuple("usage", "total used free")
        monkeypatch.setattr(downloads.shutil, "disk_usage", lambda p: usage(1 << 30, 0, 1 << 20))
        assert download_checkpoint(REPO, tmp_path, endpoint=hub.url) == folder
    assert not downloads.is_incomplete(folder)


def test_an_empty_file_of_the_repository_arrives(files, tmp_path):
    with FakeHub(REPO, dict(files, **{"merges.txt": b""})) as hub:
        folder = download_checkpoint(REPO, tmp_path, endpoint=hub.url)
    assert (folder / "merges.txt").read_bytes() == b""


def test_a_modelscope_download_finishes_the_folder(files, tmp_path, monkeypatch):
    """Got from ModelScope after the hub's try stopped: the hub's marker stayed, and the
    complete folder was refused as a download not finished."""
    import sys
    import types

    def snapshot_download(model_id, local_dir, allow_patterns):
        for name, data in files.items():
            (tmp_path / "Qwen--Qwen3-VL-Tiny-Test" / name).write_bytes(data)
        return local_dir

    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(
        snapshot_download=snapshot_download))  # fmt: skip
    folder = tmp_path / "Qwen--Qwen3-VL-Tiny-Test"
    folder.mkdir()
    (folder / downloads.MARKER).write_text("https://hf-mirror.com/Qwen/Qwen3-VL-Tiny-Test\n")
    assert downloads.download_from_modelscope(REPO, tmp_path) == folder
    assert not downloads.is_incomplete(folder)
