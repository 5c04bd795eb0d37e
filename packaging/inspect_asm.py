"""Print what the hot kernels compile to on this machine: per kernel and signature, the count
of each vector instruction (NEON on aarch64, AVX on x86-64), and the full assembly in files.

    python packaging/inspect_asm.py OUT_DIR

Used by packaging/test-arm64.sh inside the emulated arm64 root (NUMBA_CPU_NAME=cortex-a76 with
the A76's NUMBA_CPU_FEATURES there shows what an RK3588's big core gets; the default is what
LLVM detects, "generic" under qemu). Numba returns no assembly for kernels loaded from its
disk cache, so run it with a fresh NUMBA_CACHE_DIR.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter

import numpy as np

# a vector instruction (AVX-VNNI's VEX forms print as "{vex} vpdpbusd")
VECTOR = re.compile(
    r"^\s*(?:\{vex\}\s+)?([a-z][a-z0-9.]*)\s+.*\b(v\d+\.\d*[bhsd]|[xyz]mm\d+)", re.M
)
WATCH = {
    "aarch64": ("fmla", "fmul", "fadd", "scvtf", "ucvtf", "sshll", "ushll", "sxtl", "uxtl",
                "sdot", "udot", "usdot", "smmla", "bfdot"),
    "x86": ("vfmadd231ps", "vcvtdq2ps", "vpmovsxbd", "vpmovsxbw", "vpdpbusd", "vpdpwssd",
            "vmulps", "vpmaddubsw", "vpmaddwd", "vpsignb", "vpabsb"),
}  # fmt: skip


def main(out_dir: str) -> int:
    from llvmlite import binding as llvm

    from merlin.engine.kernels import attention as att
    from merlin.engine.kernels import qgroup as qg
    from merlin.engine.kernels import qlinear as ql
    from merlin.engine.quant import quantize_q4, quantize_q8

    os.makedirs(out_dir, exist_ok=True)
    from merlin.engine.kernels.target import TARGET

    cpu = os.environ.get("NUMBA_CPU_NAME") or f"host ({llvm.get_host_cpu_name()})"
    print(f"target cpu: {cpu}; cache {os.environ.get('NUMBA_CACHE_DIR')}")
    print(f"kernel class: {TARGET.describe()}")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    out = np.zeros((2, 64), np.float32)
    q8 = quantize_q8(w)
    ql.matmul_q8(x, q8.qs, q8.scales, out)
    q4 = quantize_q4(w)
    qg.matmul_q4g(x, *qg.pack_q4_groups(q4.qs, q4.scales), out)  # q4 as the model runs it
    # attention with the engine's own KV cache arrays: one short forward per KV format
    from merlin.engine.demo import ensure_demo_checkpoint
    from merlin.engine.model import load_model
    from merlin.engine.warmup import run_question

    model = load_model(ensure_demo_checkpoint(), weights="q8", kv="f32")
    for kv in ("f32", "q8"):
        run_question(model, kv, image=False)

    watch = WATCH["x86" if "86" in os.uname().machine else "aarch64"]
    found: Counter = Counter()
    for name, fn in (
        ("matmul_q8", ql.matmul_q8),
        ("matmul_q4g", qg.matmul_q4g),
        ("attention", att.attention),
    ):
        for i, sig in enumerate(fn.signatures):
            asm = fn.inspect_asm(sig)
            with open(os.path.join(out_dir, f"{name}-{i}.s"), "w") as f:
                f.write(asm)
            mnemonics = Counter(m.group(1) for m in VECTOR.finditer(asm))
            found.update(mnemonics)
            args = ", ".join(
                f"{a.dtype}{'' if a.mutable else ' ro'}" if hasattr(a, "dtype") else str(a)
                for a in sig
            )
            top = ", ".join(f"{m} {n}" for m, n in mnemonics.most_common(12))
            print(f"{name}({args}): {len(asm.splitlines())} lines")
            print(f"    vector instructions: {top or 'none (cached code? use a fresh cache)'}")
            watched = ", ".join(f"{m} {mnemonics[m]}" for m in watch if mnemonics[m])
            print(f"    watched: {watched or '-'}")
    absent = [m for m in watch if not found[m]]
    print(f"never used: {', '.join(absent) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "asm"))
