"""Every CPU class (engine/kernels/target.py) that can be built on this host, each in its own
process and Numba cache (the class is decided at import): the grouped q4/q8/q8a8 kernels, the
row-major q8 kernel and attention, rows bitwise equal to 1-row calls for N = 1..9 and on their
NumPy twins, the int16 dot bounds at their extremes (class_check.py); outputs bitwise equal
across the classes of one group size; and the intended dot instructions in the assembly.

x86 classes are built by naming a CPU to Numba (NUMBA_CPU_NAME, its default features); the
aarch64 ones cannot run here: arm64-neon's plain IR is built for this CPU instead (its
instructions are checked under qemu, packaging/test-arm64.sh), arm64-dotprod only there."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from merlin.engine.kernels.target import TARGET, machine_arch

CHECK = Path(__file__).with_name("class_check.py")
X86 = machine_arch() == "x86"
HOST_FEATURES = TARGET.features

# class -> (environment, instructions that must appear, instructions that must not)
CASES = {
    "x86-avx2": (
        {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""},
        {"vpmaddubsw", "vpmaddwd", "vpsignb"},
        {"vpdpbusd", "{vex} vpdpbusd", "<zmm>"},
    ),
    "x86-avxvnni": (
        {"NUMBA_CPU_NAME": "alderlake", "NUMBA_CPU_FEATURES": ""},
        {"{vex} vpdpbusd", "{vex} vpdpwssd"},
        {"<zmm>", "vpmaddubsw", "vpmaddwd"},  # vpdpwssd kept whole (target.FUSED_DPWSSD)
    ),
    "x86-avx512vnni": ({}, {"vpdpbusd", "vpdpwssd", "<zmm>"}, {"vpmaddubsw", "vpmaddwd"}),
    "arm64-neon": ({"MERLIN_CPU_CLASS": "arm64-neon"}, set(), {"vpdpbusd", "vpmaddubsw"}),
    "generic": ({"MERLIN_CPU_CLASS": "generic"}, set(), {"vpdpbusd", "vpmaddubsw"}),
}
NEEDS = {"x86-avx2": {"avx2"}, "x86-avxvnni": {"avx2", "avxvnni"}, "x86-avx512vnni": set()}


def buildable(name: str) -> bool:
    if name in ("arm64-neon", "generic"):
        return True
    if not X86:
        return False
    if name == "x86-avx512vnni":
        return TARGET.name == "x86-avx512vnni"
    return NEEDS[name] <= HOST_FEATURES  # the host must run what is built for that CPU


_BUILDS: dict[str, tuple[subprocess.Popen, Path]] = {}
_FOLDER: list[Path] = []


def start_builds() -> None:
    """Start every buildable class's check now, at the lowest CPU priority (tests/engine/
    kernels/conftest.py calls this once the session has collected a test of this module): each
    is a cold, single-threaded compile of minutes, which runs on the cycles the rest of the
    suite leaves idle. Each has a kernel cache of its own, empty (kernels loaded from a cache
    have no assembly to inspect)."""
    if _BUILDS:
        return
    atexit.register(_stop_builds)  # a session that ends before the tests leaves none running
    _FOLDER.append(Path(tempfile.mkdtemp(prefix="merlin-classes-")))
    for name in filter(buildable, CASES):
        env_extra, _, _ = CASES[name]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CPU", "MERLIN_CPU"))}
        folder = _FOLDER[0] / name
        folder.mkdir()
        env.update(env_extra, NUMBA_CACHE_DIR=str(folder / "numba"))  # cold: its assembly is read
        with open(folder / "stdout", "w") as stdout, open(folder / "stderr", "w") as stderr:
            proc = subprocess.Popen(
                ["nice", "-n", "19", sys.executable, str(CHECK), name, str(folder / "out.npz")],
                env=env, stdout=stdout, stderr=stderr,
            )  # fmt: skip
        _BUILDS[name] = (proc, folder)


def _stop_builds() -> None:
    for proc, _ in _BUILDS.values():
        proc.kill()
        proc.wait()
    for folder in _FOLDER:
        shutil.rmtree(folder, ignore_errors=True)
    _BUILDS.clear()  # a later start_builds starts afresh
    _FOLDER.clear()


@pytest.fixture(scope="module")
def runs():
    """class -> (saved outputs, assembly counts, shapes), from the checks start_builds began."""
    start_builds()
    done: dict = {}
    failed: dict = {}
    try:
        for name, (proc, folder) in _BUILDS.items():
            proc.wait(timeout=3600)
            stdout = (folder / "stdout").read_text()
            if proc.returncode != 0 or "class ok" not in stdout:
                failed[name] = (folder / "stderr").read_text()[-3000:]
                continue
            lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in stdout.splitlines()}
            with np.load(folder / "out.npz") as f:
                arrays = dict(f)
            done[name] = (arrays, json.loads(lines["asm"]), json.loads(lines["shapes"]))
    finally:
        _stop_builds()

    def run(name):
        assert name not in failed, failed[name]
        return done[name]

    return run


@pytest.mark.parametrize("name", list(CASES))
def test_class_builds_and_keeps_rows_bitwise(name, runs):
    if not buildable(name):
        pytest.skip(f"{name} cannot be built and run on this host ({TARGET.cpu_name})")
    arrays, asm, shapes = runs(name)
    _, present, absent = CASES[name]
    assert {m for m in present if asm.get(m)} == present, asm
    assert not {m for m in absent if asm.get(m)}, asm
    assert shapes["group"] == (16 if name == "x86-avx512vnni" else 8)
    assert shapes["q8a8_bias"] == (
        128 if name in ("x86-avx512vnni", "x86-avxvnni", "generic") else 0
    )
    if name == "x86-avx512vnni":  # qgroup.own_row_pointers: register + displacement
        assert not {2, 5, 6, 7, 8} & set(asm["<q4 tiles with indexed dots>"]), asm
        assert not {6, 7, 8} & set(asm["<q8 tiles with indexed dots>"]), asm
    if name in ("arm64-neon", "generic"):  # the NEON-sized tiles
        assert shapes["qlinear_tile"] == [3, 1] and shapes["attention_tiles"] == [2, 32, 2, 32]


def test_classes_compute_the_same_bits(runs):
    """Exact integer dots: every 8-row class gives the same outputs, bit for bit (the float
    operations per output are the same sequence)."""
    names = [n for n in CASES if n != "x86-avx512vnni" and buildable(n)]
    assert len(names) >= 2
    first, *others = names
    base = runs(first)[0]
    for name in others:
        arrays = runs(name)[0]
        for key in ("q4", "q8", "q8a8", "q4-ext", "q8a8-ext", "q8-ext"):
            assert np.array_equal(arrays[key], base[key]), (name, first, key)
