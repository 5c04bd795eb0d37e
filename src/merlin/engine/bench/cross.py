"""The hot kernels' assembly for a named CPU, this host's or another architecture's.

    compile_asm(triple, cpu, features) -> {"group": G, "tile_rows": R, "asm": {kernel: text}}

Runs a child process (`python -m merlin.engine.bench.cross`) with NUMBA_CPU_NAME /
NUMBA_CPU_FEATURES set and a fresh, empty NUMBA_CACHE_DIR (Numba shows no assembly for kernels
loaded from its disk cache). For another architecture (an aarch64 CPU on this x86-64 host) the
child makes Numba target that triple: llvmlite's LLVM carries every backend, so with all
targets initialised and the process triple (and `platform.machine()`, which the kernels read
to choose their dot instructions) reporting the foreign one, Numba lowers, optimises and
emits the kernels exactly as on that machine. Nothing compiled that way is ever called; the
kernels are compiled from explicit signatures (numba.typeof of arrays of the engine's real
layouts), not by running them.

HOT_KERNELS names what is compiled: the grouped q4, q8 and q8a8 weight products, the
attention over an int8 (q8) KV cache, and each pass a query makes over its keys outside the
attention's integer products (attention.ROW_PASSES: softmax and the weights' quantization,
compiled one pass a function, so that each listing's main loop is that pass's), the loops a
decode step spends its time in.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# name in the report -> (module, function)
KERNELS = {
    "q4": ("merlin.engine.kernels.qgroup", "matmul_q4g"),
    "q8": ("merlin.engine.kernels.qgroup", "matmul_q8g"),
    "q8a8": ("merlin.engine.kernels.qgroup", "matmul_q8a8g"),  # q4 models' lm_head
    "attention_q8": ("merlin.engine.kernels.attention", "attention"),
    "clock": ("merlin.engine.bench.clock", "chain"),  # a latency chain: the clock probe
}
# the functions of attention.ROW_PASSES (named here: importing the kernels before _pretend
# would fix them to this host's CPU class)
ROW_PASS_KERNELS = tuple(
    f"pass{name}"
    for name in (
        "_scale_row",
        "_vector_max",
        "_exp_row",
        "_sum_row",
        "_normalize_row",
        "_round_row",
    )
)
KERNELS |= {kernel: ("merlin.engine.kernels.attention", kernel[4:]) for kernel in ROW_PASS_KERNELS}
HOT_KERNELS = ("q4", "q8", "q8a8", "attention_q8", *ROW_PASS_KERNELS)


class CrossCompileError(RuntimeError):
    pass


def compile_asm(
    triple: str | None,
    cpu: str,
    features: str | None,
    kernels=HOT_KERNELS,
    timeout: float = 3600,
    cache: Path | None = None,
) -> dict:
    """Assembly of `kernels` (names in KERNELS) compiled for (triple, cpu, features); triple
    None: this host's. Raises CrossCompileError with the child's error output if it fails.
    cache: a folder keeping the result, keyed by the target, Numba's version and the source
    of the kernels (compiling the four hot kernels for one CPU takes minutes)."""
    path = None
    if cache is not None:
        path = Path(cache) / f"{_key(triple, cpu, features, kernels)}.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    result = _compile(triple, cpu, features, kernels, timeout)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result), encoding="utf-8")
        os.replace(tmp, path)
    return result


def _key(triple, cpu, features, kernels) -> str:
    import numba

    h = hashlib.sha256(repr((triple, cpu, features, tuple(kernels), numba.__version__)).encode())
    engine = Path(__file__).resolve().parent.parent
    for src in sorted((engine / "kernels").glob("*.py")) + [engine / "bench" / "clock.py"]:
        h.update(src.read_bytes())
    return h.hexdigest()[:24]


def _compile(triple, cpu, features, kernels, timeout) -> dict:
    with tempfile.TemporaryDirectory(prefix="merlin-cross-") as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=tmp, NUMBA_CPU_NAME=cpu)
        env.pop("NUMBA_CPU_FEATURES", None)
        if features is not None:
            env["NUMBA_CPU_FEATURES"] = features
        out = os.path.join(tmp, "asm.json")
        cmd = [sys.executable, "-m", "merlin.engine.bench.cross", out, triple or "host"]
        cmd += list(kernels)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode or not os.path.exists(out):
            raise CrossCompileError(
                f"compiling the kernels for {cpu} ({triple or 'host'}) failed:\n"
                + done.stderr[-3000:]
            )
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def _pretend(triple: str) -> None:
    """Make Numba (and the kernels' CPU checks) target `triple` in this process."""
    import platform

    from llvmlite import binding as ll

    ll.initialize_all_targets()
    ll.initialize_all_asmprinters()
    ll.get_process_triple = lambda: triple
    machine = triple.split("-")[0]
    platform.machine = lambda: machine


def _example_args(kernel: str) -> tuple:
    """Small arrays in the layouts the engine passes (only their types matter)."""
    import numpy as np

    from ..kernels import qgroup as qg
    from ..kv_cache import KVCache

    if kernel == "clock":
        return (np.uint64(1), 1000)
    if kernel in ROW_PASS_KERNELS:  # a row of scores, its length, a float, another row
        row, n, f = np.zeros(64, np.float32), 64, np.float32(1.0)
        return {
            "pass_scale_row": (row, n, row, f),
            "pass_vector_max": (row, n),
            "pass_exp_row": (row, n, f),
            "pass_sum_row": (row, n),
            "pass_normalize_row": (row, n, f, row),
            "pass_round_row": (row, n, f, np.zeros(64, np.int16)),
        }[kernel]
    rng = np.random.default_rng(0)
    x = np.zeros((2, 256), np.float32)
    out = np.zeros((2, 2 * qg.GROUP), np.float32)
    scales = np.ones((2 * qg.GROUP, 8), np.uint16)
    if kernel == "q4":
        qs = rng.integers(0, 256, (2 * qg.GROUP, 128), dtype=np.uint8)
        return (x, *qg.pack_q4_groups(qs, scales), out)
    if kernel == "q8":
        qs = rng.integers(-127, 128, (2 * qg.GROUP, 256), dtype=np.int8)
        return (x, *qg.pack_q8_groups(qs, scales), out)
    if kernel == "q8a8":
        qs = rng.integers(-127, 128, (2 * qg.GROUP, 256), dtype=np.int8)
        return (x, *qg.pack_q8a8_groups(qs, scales), out)
    cache = KVCache(1, 2, 128, 128, "q8")
    q = np.zeros((1, 4, 128), np.float32)
    return (q, *cache.layer(0), 0, np.float32(128**-0.5), np.zeros((1, 512), np.float32))


def _child(out_path: str, triple: str, kernels: list[str]) -> int:
    if triple != "host":
        _pretend(triple)
    import importlib

    import numba

    from ..kernels import qgroup as qg

    result = {"group": qg.GROUP, "tile_rows": qg.TILE_ROWS, "dot": qg.DOT, "asm": {}}
    for name in kernels:
        module, fn_name = KERNELS[name]
        fn = getattr(importlib.import_module(module), fn_name)
        sig = tuple(numba.typeof(a) for a in _example_args(name))
        fn.compile(sig)
        result["asm"][name] = fn.inspect_asm(sig)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2], sys.argv[3:]))
