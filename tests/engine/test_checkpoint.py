"""Checkpoint loading: both config spellings, shards, dtypes, and a clear CheckpointError
naming the file for every malformed input."""

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from support import REFERENCE_DIRS

from merlin.engine.checkpoint import Checkpoint, SafetensorsFile, f32_to_bf16, save_safetensors
from merlin.engine.config import load_config
from merlin.engine.errors import CheckpointError
from merlin.engine.text import check_text_tensors

BF16_DIR = next(p for p in REFERENCE_DIRS if "v457" in p.name)


def write_raw(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(body) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + body + data)
    return path


def test_both_config_spellings_load_the_same_values():
    old = load_config(BF16_DIR)  # rope_theta + rope_scaling inside text_config (4.57)
    new_dir = next(p for p in REFERENCE_DIRS if "v457" not in p.name)
    new = load_config(new_dir)  # rope_parameters (5.x)
    raw_new = json.loads((new_dir / "config.json").read_text())
    assert "rope_parameters" in raw_new["text_config"]
    assert old.tie_word_embeddings and not new.tie_word_embeddings
    assert old.text.rope_theta == 5e6
    assert new.text.rope_theta == raw_new["text_config"]["rope_parameters"]["rope_theta"]
    assert new.text.mrope_section == tuple(
        raw_new["text_config"]["rope_parameters"]["mrope_section"]
    )


def test_sharded_checkpoint_reads_every_tensor():
    folder = next(p for p in REFERENCE_DIRS if "sharded" in p.name)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    with Checkpoint(folder) as ckpt:
        assert len(ckpt.files) > 1
        assert set(ckpt.tensors) == set(index["weight_map"])


def test_bf16_roundtrip_and_conversion(tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    save_safetensors(tmp_path / "a.safetensors", {"x": x}, dtype="BF16")
    f = SafetensorsFile(tmp_path / "a.safetensors")
    from merlin.engine.checkpoint import to_f32

    y = to_f32(f.raw("x"), "BF16")
    expected = (f32_to_bf16(x).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(y, expected)
    assert np.abs(y - x).max() <= np.abs(x).max() * 2**-8
    f.close()


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_float_dtypes(tmp_path, dtype):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_safetensors(tmp_path / "a.safetensors", {"x": x}, dtype=dtype)
    f = SafetensorsFile(tmp_path / "a.safetensors")
    from merlin.engine.checkpoint import to_f32

    assert np.array_equal(to_f32(f.raw("x"), dtype), x)
    f.close()


BAD_FILES = {
    "too short": (b"\x01\x02", None, b""),
    "header longer than file": (
        {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        10_000,
        b"",
    ),
    "huge header length": ({}, 2**62, b""),
    "not json": (b"{not json", None, b""),
    "not an object": (b"[1, 2]", None, b""),
    "unknown dtype": (
        {"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}},
        None,
        b"\0" * 4,
    ),
    "offsets outside data": (
        {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
        None,
        b"\0" * 8,
    ),
    "shape disagrees with offsets": (
        {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        None,
        b"\0" * 8,
    ),
    "overflowing shape": (
        {"x": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}},
        None,
        b"\0" * 8,
    ),
    "negative shape": (
        {"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}},
        None,
        b"\0" * 8,
    ),
    "overlapping tensors": (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        None,
        b"\0" * 12,
    ),
    "duplicate names": (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        None,
        b"\0" * 4,
    ),
    "bad offsets type": (
        {"x": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}},
        None,
        b"\0" * 4,
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_malformed_safetensors_give_clear_error(tmp_path, case):
    header, length, data = BAD_FILES[case]
    path = write_raw(tmp_path / "model.safetensors", header, data, length)
    with pytest.raises(CheckpointError) as err:
        SafetensorsFile(path)
    assert str(path) in str(err.value)


def copy_fixture(tmp_path, src=BF16_DIR):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_truncated_checkpoint(tmp_path):
    folder = copy_fixture(tmp_path)
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="truncated|outside"):
        Checkpoint(folder)


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder"):
        load_config(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_config(tmp_path)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        Checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        load_config(tmp_path / "model.safetensors")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(CheckpointError, match="loop of links"):
        load_config(tmp_path / "loop")


def edit_config(folder, edit):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def test_unsupported_model_type(tmp_path):
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: c.update(model_type="llama"))
    with pytest.raises(CheckpointError, match="'llama' is not supported"):
        load_config(folder)


def test_shape_not_matching_config(tmp_path):
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: c["text_config"].update(intermediate_size=100))
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt, pytest.raises(CheckpointError, match="does not match"):
        check_text_tensors(ckpt, cfg)


@pytest.mark.parametrize("change", [-1, 1])
def test_a_layer_count_not_matching_the_weights(tmp_path, change):
    """Fewer layers in config.json than in the weights had run a truncated model without a
    word (more was refused already)."""
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: c["text_config"].update(
        num_hidden_layers=c["text_config"]["num_hidden_layers"] + change))  # fmt: skip
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt, pytest.raises(CheckpointError, match="does not match"):
        check_text_tensors(ckpt, cfg)


def test_untied_config_without_lm_head(tmp_path):
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: c.update(tie_word_embeddings=False))
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt, pytest.raises(CheckpointError, match="lm_head"):
        check_text_tensors(ckpt, cfg)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda c: c["text_config"].pop("hidden_size"), "hidden_size' is missing"),
        (lambda c: c["text_config"].update(num_attention_heads="4"), "must be an integer"),
        (lambda c: c["text_config"].update(num_key_value_heads=3), "not a multiple"),
        (lambda c: c["text_config"]["rope_scaling"].update(mrope_section=[1, 1, 1]), "add up"),
        (lambda c: c.pop("text_config"), "text_config"),
        (lambda c: c["vision_config"].update(hidden_act="relu"), "vision hidden_act 'relu'"),
    ],
)
def test_bad_config_values(tmp_path, edit, match):
    folder = copy_fixture(tmp_path)
    edit_config(folder, edit)
    with pytest.raises(CheckpointError, match=match):
        load_config(folder)


def test_corrupt_config_json(tmp_path):
    folder = copy_fixture(tmp_path)
    (folder / "config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_config(folder)


@pytest.mark.parametrize("tensor", ["layers.0.self_attn.q_proj.weight", "embed_tokens.weight"])
def test_integer_decoder_matrix_is_named(tmp_path, tensor):
    """A decoder matrix stored as integers (same byte size: BF16 relabelled I16) is refused
    before anything loads, naming the file and the tensor."""
    folder = copy_fixture(tmp_path)
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k.endswith(tensor) and "visual" not in k)
    assert header[name]["dtype"] == "BF16"
    header[name]["dtype"] = "I16"
    body = json.dumps(header, separators=(",", ":")).encode()
    assert len(body) <= n
    write_raw(f, body + b" " * (n - len(body)), raw[8 + n :])
    cfg = load_config(folder)
    with Checkpoint(folder) as ckpt, pytest.raises(CheckpointError) as e:
        check_text_tensors(ckpt, cfg)
    assert (
        "dtype I16" in str(e.value) and name in str(e.value) and "model.safetensors" in str(e.value)
    )


def test_unreadable_folder_is_not_a_missing_config(tmp_path, monkeypatch):
    """A folder this user may not search (chmod 000 by another user: root, who runs these
    tests, is never refused, so the refusal is simulated) gives permission denied, not
    'config.json is missing'."""
    import errno
    import os

    folder = copy_fixture(tmp_path)
    real_lstat = os.lstat

    def lstat(path, *a, **k):
        if str(path).startswith(str(folder)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_lstat(path, *a, **k)

    monkeypatch.setattr(os, "lstat", lstat)
    with pytest.raises(CheckpointError, match="Permission denied.*permissions"):
        load_config(folder)


def test_a_model_is_named_after_its_folder_or_its_hub_repository(demo_model, tmp_path, monkeypatch):
    """The name the server publishes: a snapshot of the Hugging Face cache is its repository
    (its folder is a commit hash), "." is the folder it means (it was an empty id)."""
    import dataclasses

    snapshot = tmp_path / "models--Qwen--Qwen3-VL-2B-Instruct" / "snapshots" / "0123abcd"
    plain = tmp_path / "my model"
    for folder in (snapshot, plain):
        folder.mkdir(parents=True)
    named = {
        dataclasses.replace(demo_model, folder=snapshot).name,
        dataclasses.replace(demo_model, folder=plain).name,
    }
    assert named == {"Qwen/Qwen3-VL-2B-Instruct", "my model"}
    monkeypatch.chdir(plain)
    assert dataclasses.replace(demo_model, folder=Path(".")).name == "my model"


def test_a_missing_shard_or_a_dangling_link_says_to_download_again(tmp_path):
    """An interrupted download (a shard the index lists is not there) and a hub cache link
    whose blob is gone had said only "file is missing" / "does not exist"."""
    import os

    folder = tmp_path / "m"
    save_safetensors(tmp_path / "a.safetensors", {"x": np.ones(2, np.float32)}, dtype="F32")
    folder.mkdir()
    index = {"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                                            "y": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    os.link(tmp_path / "a.safetensors", folder / "model-00001-of-00002.safetensors")
    with pytest.raises(CheckpointError, match="incomplete: download the checkpoint again") as e:
        Checkpoint(folder)
    assert "model-00002-of-00002.safetensors" in str(e.value)
    link = tmp_path / "model.safetensors"
    link.symlink_to(tmp_path / "blobs" / "0123abcd")
    with pytest.raises(CheckpointError, match="which is gone; download it again"):
        SafetensorsFile(link)


def test_defaults_are_those_transformers_takes(tmp_path):
    """A key config.json leaves out means transformers' default, so a config it runs computes
    the same here: Qwen3-VL's dense head_dim is 128 (not hidden / heads: such a config was
    refused over its mrope_section), and a vision config without deepstack_visual_indexes
    feeds blocks 8, 16 and 24 (it had fed none: image answers silently wrong)."""
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: (
        c["text_config"].pop("head_dim"), c["vision_config"].update(depth=27),
        c["text_config"]["rope_scaling"].update(mrope_section=[24, 20, 20]),
        c["vision_config"].pop("deepstack_visual_indexes")))  # fmt: skip
    cfg = load_config(folder)
    assert cfg.text.head_dim == 128
    assert cfg.vision.deepstack_visual_indexes == (8, 16, 24)


def test_a_default_deepstack_stops_at_the_depth(tmp_path):
    """transformers' loop over the blocks never reaches a default index past the depth."""
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: (
        c["vision_config"].pop("deepstack_visual_indexes"),
        c["vision_config"].update(depth=9)))  # fmt: skip
    assert load_config(folder).vision.deepstack_visual_indexes == (8,)


def test_a_checkpoint_quantized_by_another_tool_is_named_so(tmp_path):
    """Qwen's FP8 releases (and AWQ, GPTQ) had been called damaged ("download it again") or
    missing a tensor: they are refused as what they are, pointing to the BF16 release."""
    folder = copy_fixture(tmp_path)
    edit_config(folder, lambda c: c.update(
        quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}))  # fmt: skip
    with pytest.raises(CheckpointError, match=r"quantized by another tool \(fp8\).*BF16"):
        load_config(folder)
    header = {"w": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]}}
    path = write_raw(tmp_path / "fp8.safetensors", header, b"\0" * 4)
    with pytest.raises(CheckpointError, match="stored as F8_E4M3") as err:
        SafetensorsFile(path)
    assert "damaged" not in str(err.value)
