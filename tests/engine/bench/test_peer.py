"""The llama.cpp side-by-side's build arguments: native, and without llama.cpp's AMX backend
on CPUs that have AMX (its repacked Q8_0/Q4_0 weights crash there; engine/bench/peer.py); its
conversion check's logits comparison."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from merlin.engine.bench import peer


def test_native_build_without_amx_flags():
    avx512 = {"avx2", "fma", "avx512f", "avx512_vnni"}
    assert peer.cmake_args(avx512, "x86-avx512vnni") == "-DGGML_NATIVE=ON"
    assert peer.cmake_args({"avx2", "fma"}, "x86-avx2") == "-DGGML_NATIVE=ON"  # a real AVX2 CPU
    assert peer.cmake_args(set(), "generic") == "-DGGML_NATIVE=ON"


def test_a_narrower_kernel_class_gets_llama_cpp_built_for_the_same_instructions(monkeypatch):
    """Merlin's AVX2 class's code on an AVX-512 host meets llama.cpp's AVX2 code, not its
    AVX-512 kernels, in a venv of its own (the native build's venv is kept)."""
    avx512 = {"avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "amx_tile"}
    for name in ("x86-avx2", "x86-avxvnni"):
        args = shlex.split(peer.cmake_args(avx512, name))
        assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args
        assert ("-DGGML_AVX_VNNI=ON" in args) == (name == "x86-avxvnni")
        assert not any("AVX512" in a or "amx" in a for a in args)
    assert peer.narrow_class({"avx2", "avx_vnni"}, "x86-avx2") == "x86-avx2"  # Alder Lake
    assert peer.narrow_class({"avx2", "avx_vnni"}, "x86-avxvnni") is None
    monkeypatch.setattr(peer, "_cpu_flags", lambda: avx512)
    monkeypatch.setattr(peer, "_kernel_class", lambda: "x86-avx2")
    assert peer.venv_dir() == peer.peer_dir() / "venv-x86-avx2"
    monkeypatch.setattr(peer, "_kernel_class", lambda: "x86-avx512vnni")
    assert peer.venv_dir() == peer.peer_dir() / "venv"


def test_amx_cpu_builds_without_the_amx_backend():
    flags = {"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"}
    args = shlex.split(peer.cmake_args(flags, "x86-avx512vnni"))
    assert args[0] == "-DGGML_NATIVE=ON"
    for lang in ("C", "CXX"):
        (flags,) = [a.split("=", 1)[1] for a in args if a.startswith(f"-DCMAKE_{lang}_FLAGS=")]
        assert set(flags.split()) == {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}


def test_cpu_flags_come_from_this_machine():
    flags = peer._cpu_flags()
    assert isinstance(flags, set)
    assert peer.cmake_args() == peer.cmake_args(flags)


def test_llama_cpp_runs_without_the_environment_merlin_set(monkeypatch):
    from merlin.engine import kernels

    monkeypatch.setattr(kernels, "SET_ENVIRONMENT", {"GOMP_SPINCOUNT"})
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    monkeypatch.setenv("MERLIN_TEST_USER_VARIABLE", "kept")
    env = peer.peer_environment()
    assert "GOMP_SPINCOUNT" not in env
    assert env["MERLIN_TEST_USER_VARIABLE"] == "kept"


def test_logits_check_tells_a_close_copy_from_a_shifted_one():
    rng = np.random.default_rng(0)
    ours = rng.standard_normal(2000) * 5
    close = ours + rng.standard_normal(2000) * 1e-4  # f16 KV-like noise
    assert peer.compare_logits(ours, close) == {
        "logits_rel_diff": pytest.approx(np.max(np.abs(ours - close)) / np.max(np.abs(ours))),
        "top_same": True,
    }
    assert peer.compare_logits(ours, close)["logits_rel_diff"] <= peer.CHECK_REL_DIFF
    # another model with the same greedy token: the best logit shared, the rest moved
    moved = ours + rng.standard_normal(2000) * 0.5
    best = np.argmax(ours)
    ours[best] = moved[best] = max(ours.max(), moved.max()) + 1
    far = peer.compare_logits(ours, moved)
    assert far["logits_rel_diff"] > peer.CHECK_REL_DIFF and not far["top_same"]
    assert peer.compare_logits(ours, ours[:-1]) == {"logits_rel_diff": np.inf, "top_same": False}
