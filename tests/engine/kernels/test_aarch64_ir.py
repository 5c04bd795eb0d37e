"""The aarch64 classes' block dots compiled by LLVM's AArch64 target (aarch64_ir.py in a
subprocess: the class is decided at import), since they cannot run here: arm64-dotprod's q4
and q8a8 are sdot (16 a row and block), arm64-neon's are widening multiplies summed in int16
(smull/smlal), never sdot; the same for the vision attention's dot steps. Running them:
packaging/test-arm64.sh (qemu)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("aarch64_ir.py")


def compile_for(cls, cpu, features, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CPU", "MERLIN_CPU"))}
    env.update(MERLIN_CPU_CLASS=cls, MERLIN_CPU_CLASS_IR_ONLY="1", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), cpu, features],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["class"] == cls
    return result["counts"]


def test_dotprod_class_is_sdot(tmp_path):
    counts = compile_for("arm64-dotprod", "cortex-a76", "+neon,+dotprod", tmp_path)
    rows = 4  # qgroup.TILE_ROWS with 8-row groups
    assert counts["q4"].get("sdot") == 16 * rows and counts["q8a8"].get("sdot") == 8 * rows * 2
    assert counts["q4"].get("and") and counts["q4"].get("ushr")  # nibbles unpacked once
    for kind in ("q4", "q8a8"):  # activation words as lanes of the block (qgroup._BlockWords)
        assert counts[kind]["sdot by element"] == counts[kind]["sdot"], (kind, counts[kind])
        assert not counts[kind].get("ld1r"), (kind, counts[kind])
    # int16 pair dots (dots.dot2: the grouped q8, the int8-cache attention): widening
    # multiply-adds by a broadcast int16, 4 a dot of 8 lanes, no pair sums gathered by uzp
    q8 = counts["q8"]
    multiplies = sum(q8.get(m, 0) for m in ("smlal", "smlal2", "smull", "smull2"))
    assert multiplies == 4 * 16 * rows and q8.get("smlal", 0) > multiplies // 3, q8
    assert not q8.get("uzp1") and not q8.get("uzp2"), q8
    for kind in ("span_scores", "span_values"):  # 4 vectors of 8 lanes: 8 sdot of 4 lanes
        assert counts[kind].get("sdot") == 8, (kind, counts[kind])


@pytest.mark.parametrize("cpu", ["cortex-a72", "cortex-a53"])
def test_neon_class_is_widening_multiplies(cpu, tmp_path):
    counts = compile_for("arm64-neon", cpu, "+neon", tmp_path)
    for kind in ("q4", "q8a8", "span_scores", "span_values"):
        assert not counts[kind].get("sdot"), kind
        assert counts[kind].get("smull"), kind
    assert counts["q4"].get("smlal", 0) >= 8 * 4 * 3  # int16 sums: multiply-accumulate
