"""Fuzzing the safetensors reader (engine.checkpoint): generated headers with targeted defects,
byte mutations of valid files, sharded indexes, and adversarial declared sizes.

Every case ends in a usable file (every tensor readable with its declared shape) or a
CheckpointError naming the file; never another exception, a hang, or an allocation driven by
a declared size instead of the bytes that are there.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from fuzzutil import attempt, dumps, fuzz, json_values, mutate_bytes, traced, watchdog
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine.checkpoint import (
    DTYPES,
    MAX_HEADER_BYTES,
    Checkpoint,
    SafetensorsFile,
    save_safetensors,
    to_f32,
)
from merlin.engine.errors import CheckpointError

NAMES = ["a", "b", "w.weight", "model.language_model.norm.weight", "x" * 40, "é", ""]
DIMS = [0, 1, 2, 3, 4, 7, 8, 16]
WILD_INTS = [-1, -(2**63), 2**31, 2**32 + 1, 2**40, 2**62, 2**63, 2**64 + 3, 10**30]


def layout(specs):
    """Valid header entries for [(name, dtype, shape)], laid out back to back."""
    entries, offset = {}, 0
    for name, dtype, shape in specs:
        n = int(np.prod(shape)) * DTYPES[dtype][1]
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    return entries, offset


def write(path, header_bytes: bytes, data: bytes, length: int | None = None):
    n = len(header_bytes) if length is None else length
    path.write_bytes(struct.pack("<Q", n % 2**64) + header_bytes + data)
    return path


def read_everything(path):
    """Open and read every tensor (raw view and f32 conversion of float ones)."""
    f = SafetensorsFile(path)
    try:
        for name, info in f.tensors.items():
            raw = f.raw(name)
            assert raw.shape == info.shape
            assert raw.nbytes == info.nbytes
            if info.dtype in ("F32", "F16", "BF16", "F64"):
                with np.errstate(all="ignore"):  # F64 beyond float32 range -> inf
                    assert to_f32(raw, info.dtype).shape == info.shape
            f.release(name)
        return len(f.tensors)
    finally:
        f.close()


@st.composite
def tensor_specs(draw):
    n = draw(st.integers(0, 4))
    names = draw(st.lists(st.sampled_from(NAMES), min_size=n, max_size=n, unique=True))
    return [
        (
            name,
            draw(st.sampled_from(sorted(DTYPES))),
            tuple(draw(st.lists(st.sampled_from(DIMS), max_size=3))),
        )
        for name in names
    ]


DEFECTS = [
    "none",
    "dtype",
    "shape_dim",
    "shape_type",
    "offsets",
    "offsets_type",
    "overlap",
    "outside",
    "missing_key",
    "entry_type",
    "metadata",
    "header_type",
    "duplicate",
    "length",
    "truncate_data",
    "extra_data",
    "utf8",
    "truncate_header",
    "nesting",
    "big_number",
    "padding",
]


def _pair(x) -> bool:
    return isinstance(x, list) and len(x) == 2 and all(type(v) is int for v in x)


@st.composite
def safetensors_cases(draw):
    """(header bytes, data bytes, declared length or None, the defects applied)."""
    specs = draw(tensor_specs())
    entries, size = layout(specs)
    defects = draw(st.lists(st.sampled_from(DEFECTS), min_size=1, max_size=3))
    names = list(entries)
    seed = draw(st.integers(0, 255))
    data = bytes((i * 131 + seed) & 0xFF for i in range(size))  # cheaper than st.binary
    header: object = dict(entries)
    raw_edits = []
    length = None
    for d in defects:
        e = header.get(draw(st.sampled_from(names))) if names and isinstance(header, dict) else None
        if d == "dtype" and isinstance(e, dict):
            e["dtype"] = draw(st.sampled_from(["f32", "Q4", "", "F8_E4M3", 7, None, "BF16"]))
        elif d == "shape_dim" and isinstance(e, dict) and isinstance(e.get("shape"), list):
            if not e["shape"]:
                e["shape"].append(1)
            i = draw(st.integers(0, len(e["shape"]) - 1))
            e["shape"][i] = draw(st.sampled_from(WILD_INTS + [5, 6]))
        elif d == "shape_type" and isinstance(e, dict):
            e["shape"] = draw(st.sampled_from([None, "4", 4, [1.0], [True], [[2]], {}, [2**70]]))
        elif d == "offsets" and isinstance(e, dict) and _pair(e.get("data_offsets")):
            i = draw(st.integers(0, 1))
            e["data_offsets"][i] = draw(st.sampled_from(WILD_INTS + [0, 1, size, size + 1]))
        elif d == "offsets_type" and isinstance(e, dict):
            e["data_offsets"] = draw(
                st.sampled_from([None, [0], [0, 1, 2], ["0", "4"], [0.0, 4.0], [False, True], 4])
            )
        elif d == "overlap" and isinstance(e, dict) and size:
            b = draw(st.integers(0, size - 1))
            header["zz"] = {
                "dtype": "U8",
                "shape": [min(4, size - b)],
                "data_offsets": [b, b + min(4, size - b)],
            }
        elif d == "outside" and isinstance(e, dict) and _pair(e.get("data_offsets")):
            n = e["data_offsets"][1] - e["data_offsets"][0]
            e["data_offsets"] = [size + 1, size + 1 + n]
        elif d == "missing_key" and isinstance(e, dict):
            e.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)
        elif d == "entry_type" and names and isinstance(header, dict):
            header[draw(st.sampled_from(names))] = draw(json_values(1))
        elif d == "metadata" and isinstance(header, dict):
            header["__metadata__"] = draw(json_values(2))
        elif d == "header_type":
            header = draw(st.sampled_from([[], [entries], "x", 1, None, True]))
        elif d == "duplicate":
            raw_edits.append("duplicate")
        elif d == "length":
            length = draw(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1, MAX_HEADER_BYTES + 1, -1]))
            if length == -1:
                length = None
                raw_edits.append("length_plus")
        elif d == "truncate_data" and data:
            data = data[: draw(st.integers(0, len(data) - 1))]
        elif d == "extra_data":
            data += b"\0" * draw(st.integers(1, 9))
        elif d in ("utf8", "truncate_header", "nesting", "big_number", "padding"):
            raw_edits.append(d)
    text = dumps(header)
    for edit in raw_edits:
        if edit == "duplicate" and text.startswith("{") and len(text) > 2:
            first = text[1:-1].split(', "')[0]
            text = "{" + first + ", " + text[1:]
        elif edit == "nesting":
            depth = draw(st.sampled_from([50, 5000, 200_000]))
            text = text[:-1] + (', "deep": ' if len(text) > 2 else '"deep": ') + "[" * depth + "}"
        elif edit == "big_number":
            text = text.replace("0", "9" * draw(st.sampled_from([20, 5000])), 1)
        elif edit == "padding":
            text += " " * draw(st.integers(1, 8))
    raw = text.encode("utf-8", "surrogatepass")
    for edit in raw_edits:
        if edit == "utf8" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw = raw[:i] + b"\xff\xfe" + raw[i + 1 :]
        elif edit == "truncate_header" and raw:
            raw = raw[: draw(st.integers(0, len(raw) - 1))]
        elif edit == "length_plus":
            length = len(raw) + draw(st.integers(1, 16))
    return raw, data, length, defects


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-safetensors")


@pytest.fixture(scope="module")
def warm(scratch, valid_file):
    """One read before memory is traced: first-use costs (lazy imports, NumPy's caches) are
    not allocations for a declared size."""
    path = scratch / "warm.safetensors"
    path.write_bytes(valid_file)
    read_everything(path)


@fuzz(1000)
@given(case=safetensors_cases())
def test_generated_headers_load_or_fail_cleanly(scratch, warm, case):
    raw, data, length, defects = case
    path = write(scratch / "model.safetensors", raw, data, length)
    size = path.stat().st_size
    with watchdog(), traced():
        out = attempt(read_everything, path, trace_memory=True)
    if out.error is not None:
        assert isinstance(out.error, CheckpointError)
        assert str(path) in str(out.error)
    # JSON parsing builds Python objects of a few times the header's size; nothing may be
    # allocated for a declared size (a shape product, an offset, the length field).
    assert out.peak <= 8 * size + 256 * 1024, (out.peak, size, defects)
    if defects == ["none"]:
        assert out.ok, out.error


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("valid") / "model.safetensors"
    save_safetensors(
        path,
        {
            "model.language_model.embed_tokens.weight": rng.standard_normal((16, 8)),
            "model.language_model.norm.weight": rng.standard_normal(8).astype(np.float32),
            "ids": np.arange(6, dtype=np.int64),
            "mask": np.ones((2, 3), dtype=bool),
        },
        dtype=None,
        metadata={"format": "pt"},
    )
    return path.read_bytes()


@fuzz(1000)
@given(data=st.data())
def test_mutated_files_load_or_fail_cleanly(scratch, valid_file, data):
    header_len = 8 + int.from_bytes(valid_file[:8], "little")
    mutated = mutate_bytes(valid_file, data.draw, hot=header_len)
    path = scratch / "mutated.safetensors"
    path.write_bytes(mutated)
    with watchdog(), traced():
        out = attempt(read_everything, path, trace_memory=True)
    if out.error is not None:
        assert str(path) in str(out.error)
    assert out.peak <= 8 * len(mutated) + 256 * 1024, (out.peak, len(mutated))


# ---- declared sizes never drive allocation -----------------------------------------------------


ADVERSARIAL = {
    "length field 2**63": (b"{}", 2**63, b""),
    "length field just past the file": (b'{"a": 1}', 9, b""),
    "length field at the cap": (b"{}", MAX_HEADER_BYTES, b""),
    "shape product 2**80": (
        {"x": {"dtype": "F64", "shape": [2**40, 2**40], "data_offsets": [0, 8]}},
        None,
        b"\0" * 8,
    ),
    "offsets claim 2**60 bytes": (
        {"x": {"dtype": "U8", "shape": [2**60], "data_offsets": [0, 2**60]}},
        None,
        b"\0" * 8,
    ),
    "offsets past u64": (
        {"x": {"dtype": "U8", "shape": [1], "data_offsets": [2**64 + 1, 2**64 + 2]}},
        None,
        b"\0" * 8,
    ),
    "zero-size but 2**80 elements declared": (
        {"x": {"dtype": "F32", "shape": [2**40, 2**40, 0], "data_offsets": [0, 0]}},
        None,
        b"",
    ),
    "zero-size with a dimension past int64": (
        {"x": {"dtype": "BF16", "shape": [10**20, 0], "data_offsets": [0, 0]}},
        None,
        b"",
    ),
    "many zero-size tensors": (
        {f"t{i}": {"dtype": "F32", "shape": [0, 2**40], "data_offsets": [0, 0]} for i in range(50)},
        None,
        b"",
    ),
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_declared_sizes_never_allocate(tmp_path, case):
    header, length, data = ADVERSARIAL[case]
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = write(tmp_path / "model.safetensors", raw, data, length)
    with traced():
        out = attempt(read_everything, path, trace_memory=True)
    assert out.peak <= path.stat().st_size + 128 * 1024, out.peak
    if case != "many zero-size tensors":
        assert isinstance(out.error, CheckpointError), case


def dense_header(n: int) -> bytes:
    """The JSON with the most Python objects per byte: `{"a": [{},{},...]}` of about n bytes."""
    return b'{"a": [' + b"{}," * ((n - 16) // 3) + b"{}]}"


def test_header_cap_bounds_parser_memory(tmp_path):
    """A header can only make the JSON parser allocate a bounded multiple of its size, and the
    size is capped: the densest header at the cap parses (and is refused) in bounded time and
    memory; a length field above the cap is refused before reading."""
    small = write(tmp_path / "small.safetensors", dense_header(1 << 20), b"")
    with traced():
        out = attempt(read_everything, small, trace_memory=True)
    assert isinstance(out.error, CheckpointError)  # "a" is not a tensor entry
    per_byte = out.peak / (1 << 20)
    assert per_byte <= 30, per_byte
    assert per_byte * MAX_HEADER_BYTES <= 256 * 1024**2
    at_cap = write(tmp_path / "cap.safetensors", dense_header(MAX_HEADER_BYTES), b"")
    out = attempt(read_everything, at_cap)  # EXAMPLE_SECONDS bounds the time
    assert isinstance(out.error, CheckpointError)
    over = write(tmp_path / "over.safetensors", b"{" + b" " * MAX_HEADER_BYTES + b"}", b"")
    with pytest.raises(CheckpointError, match="byte limit"):
        SafetensorsFile(over)


# ---- sharded checkpoints --------------------------------------------------------------------


@st.composite
def index_cases(draw):
    weight_map = {"a": "model-1.safetensors", "b": "model-2.safetensors"}
    data = {"metadata": {"total_size": 32}, "weight_map": weight_map}
    edit = draw(
        st.sampled_from(["none", "file", "name", "type", "map_type", "missing", "json", "extra"])
    )
    if edit == "file":
        weight_map["a"] = draw(
            st.sampled_from(
                [
                    "../model-1.safetensors",
                    "/etc/passwd",
                    "",
                    ".",
                    "..",
                    "model-3.safetensors",
                    "model-1.safetensors\u0000",
                    "sub/model-1.safetensors",
                    "x" * 300,
                    "model-2.safetensors",
                    "config.json",
                ]
            )
        )
    elif edit == "name":
        weight_map[draw(st.sampled_from(["c", "", "a "]))] = "model-1.safetensors"
    elif edit == "type":
        weight_map["b"] = draw(json_values(1))
    elif edit == "map_type":
        data["weight_map"] = draw(json_values(1))
    elif edit == "missing":
        del data["weight_map"]
    elif edit == "extra":
        data[draw(st.text(max_size=5))] = draw(json_values(2))
    text = dumps(data)
    if edit == "json":
        text = text[: draw(st.integers(0, len(text) - 1))]
    return text, edit


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    save_safetensors(folder / "model-1.safetensors", {"a": np.ones(4, np.float32)}, dtype="F32")
    save_safetensors(folder / "model-2.safetensors", {"b": np.ones(4, np.float32)}, dtype="F32")
    (folder / "config.json").write_text("{}")
    return folder


@pytest.mark.parametrize(
    "name",
    ["../model-1.safetensors", "/etc/passwd", "", ".", "..", "a\u0000b", "sub/x", "a\\b", 7],
)
def test_shard_names_that_leave_the_folder_are_refused(shard_dir, name):
    data = {"weight_map": {"a": "model-1.safetensors", "b": name}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="shard name"):
        Checkpoint(shard_dir)


@fuzz(200)
@given(case=index_cases())
def test_sharded_index_loads_or_fails_cleanly(shard_dir, case):
    text, edit = case
    (shard_dir / "model.safetensors.index.json").write_text(text, "utf-8", "surrogatepass")

    def load():
        with Checkpoint(shard_dir) as ckpt:
            return {n: ckpt.read_f32(n).tolist() for n in ckpt.tensors}

    with watchdog():
        out = attempt(load)
    if edit == "none":
        assert out.result == {"a": [1.0] * 4, "b": [1.0] * 4}
    if out.ok:  # never a file outside the folder
        assert set(out.result) <= {"a", "b"}
