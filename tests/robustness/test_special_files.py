"""Every file the engine opens is opened without blocking on special files: a FIFO, a folder
or a device where a file is expected ends in a MerlinError that says what it is (never a hang,
never "missing"). Each case runs in a thread that must finish within seconds."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
from fuzzutil import fuzz
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine.errors import MerlinError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
SECONDS = 20


def finishes(fn, *args):
    """fn(*args) in a thread: its MerlinError (or result); fails the test on a hang."""
    out = {}

    def run():
        try:
            out["result"] = fn(*args)
        except MerlinError as e:
            out["error"] = e
        except BaseException as e:  # noqa: BLE001 - reported below
            out["other"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(SECONDS)
    assert not t.is_alive(), f"{fn.__name__} blocked on a special file"
    assert "other" not in out, f"not a MerlinError: {out.get('other')!r}"
    return out


def make_special(path, kind: str) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero" if kind == "zero" else "/dev/null")


KINDS = ["fifo", "dir", "devnull", "zero"]
WORDS = {"fifo": "FIFO", "dir": "folder", "devnull": "device", "zero": "device"}
CHECKPOINT_FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "generation_config.json",
]


@fuzz(24)
@given(name=st.sampled_from(CHECKPOINT_FILES), kind=st.sampled_from(KINDS))
def test_checkpoint_file_replaced_by_special_file(demo_dir, tmp_path_factory, name, kind):
    from merlin.engine.model import load_model

    folder = tmp_path_factory.mktemp("ckpt") / "m"
    shutil.copytree(demo_dir, folder)
    make_special(folder / name, kind)
    out = finishes(load_model, folder)
    if "result" in out and name == "preprocessor_config.json":
        # the text model is usable; images are refused with the reason
        out = finishes(out["result"].vision.require)
    assert "error" in out, f"{name} as a {kind} was accepted"
    message = str(out["error"])
    assert WORDS[kind] in message and name in message, message
    assert "missing" not in message


@pytest.mark.parametrize("kind", KINDS)
def test_shard_and_index_as_special_files(demo_dir, tmp_path, kind):
    import json

    from merlin.engine.checkpoint import Checkpoint

    folder = tmp_path / "m"
    shutil.copytree(demo_dir, folder)
    with Checkpoint(folder) as ckpt:
        names = list(ckpt.tensors)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    index = {"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    make_special(folder / "model-00001-of-00001.safetensors", kind)
    out = finishes(Checkpoint, folder)
    assert WORDS[kind] in str(out["error"])
    make_special(folder / "model.safetensors.index.json", kind)
    out = finishes(Checkpoint, folder)
    assert WORDS[kind] in str(out["error"])


@pytest.mark.parametrize("kind", KINDS)
def test_image_as_special_file(demo_model, tmp_path, kind):
    path = tmp_path / "photo.png"
    make_special(path, kind)
    out = finishes(demo_model.vision.prepare, str(path), None)
    assert "error" in out and "photo.png" in str(out["error"])


@pytest.mark.parametrize("kind", KINDS)
def test_session_file_as_special_file(demo_model, tmp_path, kind):
    from merlin.engine.session import Session

    path = tmp_path / "chat.msession"
    make_special(path, kind)
    out = finishes(Session.open, demo_model, path)
    session, result = out["result"]
    assert not result.restored and WORDS[kind] in result.reason


@pytest.mark.parametrize("kind", KINDS)
def test_image_a_session_refers_to_is_a_special_file(demo_model, tmp_path, kind):
    """A saved session whose image is now a FIFO: the next turn reports it, never blocks."""
    from PIL import Image

    from merlin.engine.session import Session

    img = tmp_path / "cat.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(img)
    s = Session(demo_model)
    for _ in s.ask("what is it?", images=[str(img)], max_new_tokens=2):
        pass
    s.messages[0].images[0].prepared = None
    for h in list(s._embeddings):  # as a session restored without its cache, in a new run
        demo_model.vision.embeddings.discard(h)
    s._embeddings.clear()
    s.drop_cache()
    make_special(img, kind)
    out = finishes(lambda: list(s.ask("and now?", max_new_tokens=2)))
    assert "error" in out and "cat.png" in str(out["error"])


def test_safe_open_refuses_without_opening(tmp_path):
    from merlin.engine.errors import InputError
    from merlin.engine.safe_open import is_regular, open_regular, read_bytes

    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="named pipe"):
        open_regular(fifo)
    assert not is_regular(fifo) and not is_regular(tmp_path) and not is_regular(tmp_path / "x")
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    assert read_bytes(f) == b"abc"
    with pytest.raises(InputError, match="more than"):
        read_bytes(f, limit=2)
    with pytest.raises(InputError, match="does not exist"):
        open_regular(tmp_path / "nothing")
