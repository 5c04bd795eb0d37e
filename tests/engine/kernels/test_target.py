"""The CPU class (engine/kernels/target.py) from features, CPU names and overrides."""

import pytest

from merlin.engine.errors import InputError
from merlin.engine.kernels import target


@pytest.mark.parametrize(
    "env, machine, expected",
    [
        ({"NUMBA_CPU_NAME": "haswell"}, "x86_64", "x86-avx2"),
        ({"NUMBA_CPU_NAME": "znver3"}, "x86_64", "x86-avx2"),
        ({"NUMBA_CPU_NAME": "skylake-avx512"}, "x86_64", "x86-avx2"),  # AVX-512 without VNNI
        ({"NUMBA_CPU_NAME": "alderlake"}, "x86_64", "x86-avxvnni"),
        ({"NUMBA_CPU_NAME": "znver4"}, "x86_64", "x86-avx512vnni"),
        ({"NUMBA_CPU_NAME": "icelake-server"}, "x86_64", "x86-avx512vnni"),
        ({"NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,-avx512f"}, "x86_64", "x86-avx2"),
        ({"NUMBA_CPU_FEATURES": "+avx2,+fma,+avxvnni"}, "x86_64", "x86-avxvnni"),
        ({"NUMBA_CPU_FEATURES": "+sse4.2,+avx"}, "x86_64", "generic"),
        ({"NUMBA_CPU_NAME": "cortex-a76"}, "aarch64", "arm64-dotprod"),
        ({"NUMBA_CPU_NAME": "cortex-a72"}, "aarch64", "arm64-neon"),
        ({"NUMBA_CPU_FEATURES": "+neon,+dotprod"}, "aarch64", "arm64-dotprod"),
        ({"NUMBA_CPU_FEATURES": "+neon"}, "aarch64", "arm64-neon"),
        ({"NUMBA_CPU_FEATURES": "+avx2,+fma"}, "riscv64", "generic"),
    ],
)
def test_class_from_features_and_names(env, machine, expected):
    t = target.detect(env, machine)
    assert t.name == expected
    assert t.group == (16 if expected == "x86-avx512vnni" else 8)


def test_an_unknown_cpu_runs_generic_and_says_so():
    t = target.detect({"NUMBA_CPU_NAME": "mystery-9000"}, "x86_64")
    assert t.name == "generic" and not t.recognised
    assert "not recognised" in t.describe() and "generic" in t.describe()


def test_override_picks_a_class_the_cpu_can_run():
    env = {"NUMBA_CPU_NAME": "icelake-server", target.ENV_CLASS: "x86-avx2"}
    t = target.detect(env, "x86_64")
    assert t.name == "x86-avx2" and t.forced and "forced" in t.describe()
    env[target.ENV_CLASS] = "arm64-neon"  # plain IR: buildable anywhere (tests)
    assert target.detect(env, "x86_64").name == "arm64-neon"


def test_override_errors_list_the_classes():
    with pytest.raises(InputError) as e:
        target.detect({target.ENV_CLASS: "avx9000"}, "x86_64")
    assert all(c.name in str(e.value) for c in target.CLASSES)
    with pytest.raises(InputError, match="lacks .*avx512vnni.*can run: x86-avx2"):
        target.detect({"NUMBA_CPU_NAME": "haswell", target.ENV_CLASS: "x86-avx512vnni"}, "x86_64")
    with pytest.raises(InputError, match="arm64-dotprod"):
        target.detect({"NUMBA_CPU_NAME": "haswell", target.ENV_CLASS: "arm64-dotprod"}, "x86_64")


def test_the_vnni_classes_ask_llvm_to_keep_vpdpwssd_whole():
    """LLVM 22 splits vpdpwssd into vpmaddwd + vpaddd on cores it does not tune as
    fast-dpwssd (this Emerald Rapids: the q8 five-row tile 1.5x slower): the VNNI classes add
    the tuning to the features Numba compiles with, nothing else changes."""

    def fused(env, machine="x86_64", llvm=(22, 1, 0)):
        t = target.detect(env, machine)
        return target.features_with_fused_dpwssd(t, env, lambda: "+avx2,+avx512vnni,+x", llvm)

    host = {"NUMBA_CPU_FEATURES": "+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni"}
    assert fused(host) == host["NUMBA_CPU_FEATURES"] + ",+fast-dpwssd"
    assert fused(dict(host, NUMBA_CPU_FEATURES=fused(host))) is None  # once
    assert fused(host, llvm=(16, 0, 0)) is None
    assert fused({"NUMBA_CPU_FEATURES": "+avx2,+fma"}) is None  # AVX2: no vpdpwssd
    assert fused({"NUMBA_CPU_FEATURES": "+neon,+dotprod"}, "aarch64") is None
    # a CPU named with its own features: the tuning alone, still that CPU's class
    named = {"NUMBA_CPU_NAME": "alderlake", "NUMBA_CPU_FEATURES": ""}
    assert fused(named) == "+fast-dpwssd"
    again = dict(named, NUMBA_CPU_FEATURES="+fast-dpwssd")
    assert target.detect(again, "x86_64").name == "x86-avxvnni" and fused(again) is None
    # a CPU named without NUMBA_CPU_FEATURES compiles with this host's: left alone
    assert fused({"NUMBA_CPU_NAME": "sapphirerapids"}) is None


def test_a_child_of_merlin_still_reads_the_hosts_features():
    """Merlin's processes pass NUMBA_CPU_FEATURES (the host's plus the tuning) to their
    children: `merlin-cli info` there still says the class came from the host's features."""
    import subprocess
    import sys

    code = (
        "import os, merlin.engine.kernels; from merlin.engine.kernels.target import detect; "
        "print(detect().source); print(os.environ.get('NUMBA_CPU_FEATURES', ''))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("NUMBA_CPU")}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    source, features = first.stdout.splitlines()
    assert source == "the host CPU's features"
    child = subprocess.run(
        [sys.executable, "-c", code], env=dict(env, NUMBA_CPU_FEATURES=features),
        capture_output=True, text=True,
    )  # fmt: skip
    assert child.stdout.splitlines() == [source, features]
