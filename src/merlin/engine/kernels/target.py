"""The CPU class the kernels are built for, decided once per process from the CPU's features.

Classes (CLASSES, best first per architecture), and what the grouped integer dots use:

    x86-avx512vnni   AVX-512 VNNI with VL (Ice Lake, Zen 4 and later): vpdpbusd / vpdpwssd zmm,
                     16-row groups
    x86-avxvnni      AVX-VNNI, the VEX form, without AVX-512 VNNI (Alder Lake and later):
                     vpdpbusd / vpdpwssd ymm, 8-row groups
    x86-avx2         AVX2 without VNNI (Haswell..Comet Lake, Zen 1-3, Skylake-X): vpmaddubsw
                     + vpmaddwd ymm, 8-row groups
    arm64-dotprod    aarch64 with the dot-product extension (Cortex-A55/A76, Neoverse N1):
                     sdot, 8-row groups
    arm64-neon       aarch64 without it (Cortex-A53/A72): widening multiplies (smull/smlal)
                     summed in int16, 8-row groups
    generic          anything else: plain LLVM vector IR, 8-row groups

Where the features come from (the CPU Numba compiles for, so that the class never names
instructions the compiled code cannot run): NUMBA_CPU_FEATURES if set and not empty; else,
with NUMBA_CPU_NAME set, a table of known CPU names (a name not in it gives "generic", never
a guess); else the host's features as LLVM detects them.

MERLIN_CPU_CLASS=<class> overrides the choice (tests, benchmarks; an unknown name is an
error listing the classes, a class whose instructions this CPU lacks an error listing the
ones it can run). The kernels' shape constants depend on the class, and Numba's disk cache
does not key on them: engine/kernels/__init__.py puts each class's compiled kernels in a
folder of its own.

This module imports neither NumPy nor Numba (kernels/__init__.py needs the class before
Numba reads its cache folder).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

ENV_CLASS = "MERLIN_CPU_CLASS"
# With this set to 1, MERLIN_CPU_CLASS may name a class this CPU cannot run: for generating
# another architecture's IR only (tests compile the aarch64 dots with LLVM's AArch64 target);
# calling a kernel then fails to compile, it never runs foreign instructions.
ENV_IR_ONLY = "MERLIN_CPU_CLASS_IR_ONLY"


@dataclass(frozen=True)
class CpuClass:
    name: str
    arch: str  # where it is detected: "x86", "aarch64" or "any"
    needs: frozenset  # LLVM features (without "+") the kernels of this class use
    dot: str  # the dot-instruction family the grouped kernels emit
    group: int  # output rows per group (int32 lanes of one dot vector)
    description: str


CLASSES = (
    CpuClass(
        "x86-avx512vnni",
        "x86",
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512vnni"}),
        "vnni",
        16,
        "x86 AVX-512 VNNI (vpdpbusd/vpdpwssd on 512-bit vectors)",
    ),
    CpuClass(
        "x86-avxvnni",
        "x86",
        frozenset({"avx2", "fma", "avxvnni"}),
        "vnni",
        8,
        "x86 AVX-VNNI (VEX vpdpbusd/vpdpwssd on 256-bit vectors)",
    ),
    CpuClass(
        "x86-avx2",
        "x86",
        frozenset({"avx2", "fma"}),
        "avx2",
        8,
        "x86 AVX2 without VNNI (vpmaddubsw + vpmaddwd)",
    ),
    CpuClass(
        "arm64-dotprod",
        "aarch64",
        frozenset({"neon", "dotprod"}),
        "sdot",
        8,
        "aarch64 with the dot-product extension (sdot)",
    ),
    CpuClass(
        "arm64-neon",
        "aarch64",
        frozenset(),
        "neon",
        8,
        "aarch64 without dotprod (smull/smlal, int16 sums)",
    ),
    CpuClass("generic", "any", frozenset(), "generic", 8, "generic (plain LLVM vector IR)"),
)
BY_NAME = {c.name: c for c in CLASSES}

# Features implied by a NUMBA_CPU_NAME given without NUMBA_CPU_FEATURES (LLVM knows them, but
# llvmlite has no call that lists a named CPU's features). Only what the classes test.
_AVX2 = {"avx", "avx2", "fma", "f16c", "bmi2"}
_AVX512VNNI = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"}
_NAMED = {
    **dict.fromkeys(
        ("haswell", "broadwell", "skylake", "x86-64-v3", "znver1", "znver2", "znver3", "bdver4",
         "cannonlake"),
        _AVX2,
    ),
    **dict.fromkeys(("skylake-avx512", "x86-64-v4"), _AVX2 | {"avx512f", "avx512bw", "avx512vl"}),
    **dict.fromkeys(
        ("icelake-client", "icelake-server", "tigerlake", "rocketlake", "cascadelake",
         "cooperlake", "znver4", "znver5"),
        _AVX512VNNI,
    ),
    **dict.fromkeys(
        ("sapphirerapids", "emeraldrapids", "graniterapids"), _AVX512VNNI | {"avxvnni"}
    ),
    **dict.fromkeys(
        ("alderlake", "raptorlake", "meteorlake", "arrowlake", "gracemont", "sierraforest",
         "grandridge", "lunarlake", "pantherlake"),
        _AVX2 | {"avxvnni"},
    ),
    **dict.fromkeys(
        ("cortex-a55", "cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78", "cortex-x1",
         "neoverse-n1", "neoverse-n2", "neoverse-v1", "apple-m1", "apple-m2", "apple-m3"),
        {"neon", "dotprod"},
    ),
    **dict.fromkeys(("cortex-a53", "cortex-a57", "cortex-a72", "cortex-a73"), {"neon"}),
}  # fmt: skip


def machine_arch(machine: str | None = None) -> str:
    m = (machine or platform.machine()).lower()
    if m in ("x86_64", "amd64", "i686", "i386"):
        return "x86"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    return m or "unknown"


def parse_features(text: str) -> frozenset:
    """'+avx2,-avx512f,+fma' -> {'avx2', 'fma'} (LLVM's flattened feature string)."""
    out = set()
    for part in text.split(","):
        part = part.strip()
        if part.startswith("+"):
            out.add(part[1:])
        elif part and part[0] not in "+-":
            out.add(part)
    return frozenset(out)


@dataclass(frozen=True)
class Target:
    """What the kernels are built for in this process."""

    cls: CpuClass
    cpu_name: str  # the CPU name LLVM compiles for
    features: frozenset  # its enabled features
    source: str  # where the features came from
    recognised: bool  # False: nothing known about this CPU fits a tuned class (generic)
    forced: bool  # MERLIN_CPU_CLASS chose the class

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def dot(self) -> str:
        return self.cls.dot

    @property
    def group(self) -> int:
        return self.cls.group

    @property
    def x86(self) -> bool:
        return self.cls.arch == "x86" or (self.cls.arch == "any" and machine_arch() == "x86")

    @property
    def x86_ir(self) -> bool:
        """Do the plain-IR kernels take their x86 forms (pair sums LLVM turns into vpmaddwd,
        register tiles sized for x86's vector registers)? Not for the generic class."""
        return self.x86 and self.cls.name != "generic"

    def describe(self) -> str:
        how = (
            f"forced by {ENV_CLASS}"
            if self.forced
            else f"from {self.source}"
            if self.recognised
            else f"CPU features not recognised ({self.source}): generic kernels"
        )
        return f"{self.cls.name}: {self.cls.description}; cpu {self.cpu_name}, {how}"


def _compile_target(env) -> tuple[str, frozenset, str]:
    """(cpu name, features, source) of what Numba compiles for."""
    name = (env.get("NUMBA_CPU_NAME") or "").strip()
    given = env.get("NUMBA_CPU_FEATURES")
    # features that are only LLVM tuning (FUSED_DPWSSD on a named CPU) leave the CPU's own
    if given and parse_features(given) - {FUSED_DPWSSD[1:]}:
        # what Merlin's own processes pass on to their children (kernels/__init__.py): the
        # host's features with the tuning, still "the host's" to a person reading `info`
        ours = not name and given == f"{host_features()},{FUSED_DPWSSD}"
        source = "the host CPU's features" if ours else "NUMBA_CPU_FEATURES"
        return name or _host_name(), parse_features(given), source
    if name and name.lower() not in ("host", "native"):
        known = _NAMED.get(name.lower())
        return name, frozenset(known or ()), "NUMBA_CPU_NAME" + ("" if known else " (unknown)")
    return _host_name(), parse_features(host_features()), "the host CPU's features"


def host_features() -> str:
    """LLVM's feature string for this host ("" when LLVM cannot tell, e.g. some emulators:
    nothing is assumed)."""
    try:
        from llvmlite import binding as llvm

        return llvm.get_host_cpu_features().flatten()
    except Exception:
        return ""


def _host_name() -> str:
    try:
        from llvmlite import binding as llvm

        return llvm.get_host_cpu_name()
    except Exception:
        return "unknown"


# classes written as plain LLVM IR (no architecture's intrinsics): they build and run on any
# CPU, so tests can force them anywhere
PORTABLE = ("arm64-neon", "generic")


def runnable(cls: CpuClass, arch: str, features: frozenset) -> bool:
    """Can code of this class run on (arch, features)?"""
    if cls.name in PORTABLE:
        return True
    return cls.arch == arch and cls.needs <= features


def detect(env=None, machine: str | None = None) -> Target:
    """The target for an environment (os.environ by default) and machine (platform's)."""
    from ..errors import InputError

    env = os.environ if env is None else env
    arch = machine_arch(machine)
    cpu, features, source = _compile_target(env)
    # NEON is part of every aarch64 CPU: arm64-neon is its floor, generic everyone else's
    best = next(c for c in CLASSES if c.arch in (arch, "any") and c.needs <= features)
    recognised = best.name != "generic"
    forced = (env.get(ENV_CLASS) or "").strip().lower()
    if not forced:
        return Target(best, cpu, features, source, recognised, False)
    if forced not in BY_NAME:
        raise InputError(
            f"{ENV_CLASS}={forced!r} is not a CPU class; known classes: {', '.join(BY_NAME)}."
        )
    cls = BY_NAME[forced]
    if not runnable(cls, arch, features) and env.get(ENV_IR_ONLY) != "1":
        can = [c.name for c in CLASSES if runnable(c, arch, features)]
        raise InputError(
            f"{ENV_CLASS}={forced}: this CPU ({cpu}, {arch}) lacks "
            f"{', '.join(sorted(cls.needs - features)) or 'the architecture'}; classes it can "
            f"run: {', '.join(can)}."
        )
    return Target(cls, cpu, features, source, True, True)


# LLVM 22's machine combiner (llvmlite 0.48-0.50) splits each vpdpwssd into vpmaddwd + vpaddd
# (and a broadcast load apart) on the x86 cores it does not tune as "fast-dpwssd" (Ice Lake,
# Sapphire and Emerald Rapids among them; Zen 4 is tuned so): shorter dependency chains, twice
# the vector uops. The grouped q8 tiles have chains enough, and split their five-row tile
# computed 15-16 against 23-24 GB/s a thread (docs/kernels.md). LLVM 20 (llvmlite 0.45-0.47)
# does not split and knows the tuning; LLVM 14-15 (0.43-0.44) do not split and would warn of
# an unknown feature, hence the LLVM >= 17 guard (docs/microbench/dpwssd_split.py, every
# llvmlite from 0.43 to 0.50).
FUSED_DPWSSD = "+fast-dpwssd"


def features_with_fused_dpwssd(target: Target, env, read_host_features, llvm_version) -> str | None:
    """The NUMBA_CPU_FEATURES that keep LLVM's vpdpwssd whole for a VNNI class, or None to
    leave the environment as it is (a class without vpdpwssd, an LLVM older than the split,
    FUSED_DPWSSD there already, or a CPU named without NUMBA_CPU_FEATURES, which Numba
    compiles with this host's features). The host's features, or the ones given, plus
    FUSED_DPWSSD; a CPU named with NUMBA_CPU_FEATURES="" (its own features) gets FUSED_DPWSSD
    alone, which LLVM adds to that CPU's own and _compile_target reads as "its own" too."""
    if target.dot != "vnni" or not target.x86 or llvm_version < (17,):
        return None
    given = env.get("NUMBA_CPU_FEATURES")
    named = (env.get("NUMBA_CPU_NAME") or "host").strip().lower() not in ("host", "native")
    if given is None:
        if named:
            return None
        given = read_host_features()
    if FUSED_DPWSSD[1:] in parse_features(given):
        return None
    return f"{given},{FUSED_DPWSSD}" if given.strip() else FUSED_DPWSSD


TARGET = detect()
