"""llama.cpp's qwen3moe against Merlin on a tiny random MoE checkpoint (a few MB): the GGUF
writer's MoE conversion gives the same greedy tokens as Merlin f32/f32, and the `moe`
section's side by side (quantize, time, alternate, summarize) runs end to end.

Marked `peer`: not part of the default suite (it needs llama.cpp built from PyPI, 5-10
minutes on 2 cores, once). Run it with `scripts/test-peer.sh`."""

from __future__ import annotations

import pytest

from merlin.engine.bench import moe as moe_bench
from merlin.engine.bench import peer
from merlin.engine.moe.random import ensure_random_moe_checkpoint

pytestmark = pytest.mark.peer


@pytest.fixture(autouse=True)
def built(monkeypatch, tmp_path):
    if not peer.venv_python().exists():  # never built here: HOME is a temporary folder
        pytest.fail(f"llama.cpp is not built in {peer.peer_dir()}: run scripts/test-peer.sh")
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "weights"))


def test_llama_cpp_and_merlin_continue_alike(tmp_path):
    c = moe_bench.check_conversion(progress=lambda m: None, root=tmp_path)
    assert len(c["merlin"]) == 16
    assert c["llama_cpp"] == c["merlin"]
    assert c["same"]


def test_side_by_side_on_the_tiny_checkpoint(tmp_path):
    folder = ensure_random_moe_checkpoint(2, tmp_path / "ckpt", shape="tiny")
    r = moe_bench.run_peer(
        folder, ("q8", "q4"), (16, 40), repeats=1, threads=1, check=False,
        progress=lambda m: None, gguf_dir=tmp_path / "gguf",
    )  # fmt: skip
    assert {p.name for p in (tmp_path / "gguf").iterdir()} == {
        f"{folder.name}-{k}.gguf" for k in ("f16", "q8_0", "q4_0")
    }
    whats = [(row["weights"], row["what"]) for row in r["summary"]]
    assert whats == [(w, x) for w in ("q8", "q4") for x in ("decode @ 16", "decode @ 40",
                                                             "prefill 512")]  # fmt: skip
    assert all(row["merlin_ms"] > 0 and row["llama_cpp_ms"] > 0 for row in r["summary"])
    text = moe_bench.peer_report(r)
    assert "q4/Q4_0" in text and "llama/Merlin" in text
