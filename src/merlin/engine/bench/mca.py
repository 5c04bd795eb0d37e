"""LLVM's machine-code analyzer (llvm-mca) on one loop body: cycles per iteration for a CPU's
scheduling model.

llvm-mca simulates the loop body run ITERATIONS times back to back on the named core's
out-of-order model (issue width, ports, latencies, register dependencies carried between
iterations); it knows nothing of caches, so its cycles are the compute-bound time of data
already in L1. It is not a Python package: Debian and Ubuntu ship it in `llvm` (any version
from 14 has the cores used here); find_llvm_mca() also looks in /usr/lib/llvm-*/bin.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile

ITERATIONS = 200
INSTALL_HINT = (
    "llvm-mca (LLVM's machine-code analyzer) is not installed; the board section needs it. "
    "Install it with `sudo apt-get install llvm` (Debian/Ubuntu; Fedora: `sudo dnf install "
    "llvm`; macOS: `brew install llvm`), or put it on PATH (or set MERLIN_LLVM_MCA to its path)."
)


class McaMissing(RuntimeError):
    pass


def find_llvm_mca() -> str | None:
    """Path of llvm-mca: MERLIN_LLVM_MCA, else PATH, else the newest /usr/lib/llvm-*/bin."""
    forced = os.environ.get("MERLIN_LLVM_MCA")
    if forced is not None:
        return forced if forced and os.access(forced, os.X_OK) else None
    found = shutil.which("llvm-mca")
    if found:
        return found
    versions = sorted(
        glob.glob("/usr/lib/llvm-*/bin/llvm-mca"),
        key=lambda p: int(re.search(r"llvm-(\d+)", p).group(1)),
    )
    return versions[-1] if versions else None


def require_llvm_mca() -> str:
    path = find_llvm_mca()
    if path is None:
        raise McaMissing(INSTALL_HINT)
    return path


def cycles_per_iteration(body: str, triple: str, mcpu: str, mca: str | None = None) -> float:
    """Simulated cycles per iteration of the loop `body` (instructions one a line) on mcpu."""
    mca = mca or require_llvm_mca()
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write(body)
        path = f.name
    try:
        done = subprocess.run(
            [mca, f"-mtriple={triple}", f"-mcpu={mcpu}", f"-iterations={ITERATIONS}", path],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        os.unlink(path)
    if done.returncode:
        raise RuntimeError(f"llvm-mca -mcpu={mcpu} failed: {done.stderr[-2000:]}")
    total = re.search(r"Total Cycles:\s+(\d+)", done.stdout)
    iters = re.search(r"Iterations:\s+(\d+)", done.stdout)
    if not (total and iters):
        raise RuntimeError(f"unexpected llvm-mca output:\n{done.stdout[:2000]}")
    return int(total.group(1)) / int(iters.group(1))
