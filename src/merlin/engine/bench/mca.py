"""LLVM's machine-code analyzer (llvm-mca) on one loop body: cycles per iteration for a CPU's
scheduling model.

llvm-mca simulates the loop body run ITERATIONS times back to back on the named core's
out-of-order model (issue width, ports, latencies, register dependencies carried between
iterations); it knows nothing of caches, so its cycles are the compute-bound time of data
already in L1. It is not a Python package: Debian and Ubuntu ship it in `llvm` and `llvm-N`;
find_llvm_mca() takes the newest found on PATH and in /usr/lib/llvm-*/bin.

Which tables a core gets depends on the version: LLVM 14-16 have no Neoverse N1 model and
schedule `-mcpu=neoverse-n1` (the Cortex-A76's core) on the Cortex-A57's tables (3-wide, a
10-cycle fmla; its resources are named A57Unit*); LLVM 19 has the N1's own (N1Unit*:
docs/benchmarks.md, session 33). scheduling_model() says which one a run used.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile

ITERATIONS = 200
VERSIONED = "/usr/lib/llvm-*/bin/llvm-mca"  # Debian's and Ubuntu's llvm-N packages
INSTALL_HINT = (
    "llvm-mca (LLVM's machine-code analyzer) is not installed; the board section needs it. "
    "Install it with `sudo apt-get install llvm` (Debian/Ubuntu; Fedora: `sudo dnf install "
    "llvm`; macOS: `brew install llvm`), or put it on PATH (or set MERLIN_LLVM_MCA to its path)."
)


class McaMissing(RuntimeError):
    pass


# the resources a core's own scheduling model names (an older LLVM gives these cores another
# core's tables: the module docstring)
OWN_MODEL_RESOURCES = {"neoverse-n1": "N1Unit", "sapphirerapids": "SPR", "alderlake": "ADLP"}


def find_llvm_mca() -> str | None:
    """Path of llvm-mca: MERLIN_LLVM_MCA, else the newest of the one on PATH and those in
    /usr/lib/llvm-*/bin (a newer LLVM models more cores: the module docstring)."""
    forced = os.environ.get("MERLIN_LLVM_MCA")
    if forced is not None:
        return forced if forced and os.access(forced, os.X_OK) else None
    found = [shutil.which("llvm-mca"), *glob.glob(VERSIONED)]
    found = [p for p in found if p and os.access(p, os.X_OK)]
    return max(found, key=llvm_version, default=None)


def llvm_version(tool: str) -> int:
    """The LLVM major version of an llvm-mca (0 when it does not say)."""
    try:
        done = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return 0
    m = re.search(r"LLVM version (\d+)", done.stdout + done.stderr)
    return int(m.group(1)) if m else 0


def scheduling_model(tool: str, triple: str, mcpu: str) -> str:
    """The name of the first resource llvm-mca schedules `mcpu` on ("N1UnitB", "A57UnitB",
    "SPRPort00", "SKXDivider"...): whose tables it really uses (OWN_MODEL_RESOURCES)."""
    probe = "add\tx0, x0, x1\n" if triple.startswith("aarch64") else "addq\t%rax, %rbx\n"
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write(probe)
        path = f.name
    try:
        done = subprocess.run(
            [tool, f"-mtriple={triple}", f"-mcpu={mcpu}", "-iterations=1", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.unlink(path)
    m = re.search(r"^\[[\d.]+\]\s+- (\w+)", done.stdout, re.M)
    return m.group(1) if m else "unknown"


def has_own_model(tool: str, triple: str, mcpu: str) -> bool | None:
    """Whether llvm-mca schedules mcpu on that core's own tables; None: not known here (a
    core not in OWN_MODEL_RESOURCES)."""
    prefix = OWN_MODEL_RESOURCES.get(mcpu)
    if prefix is None:
        return None
    return scheduling_model(tool, triple, mcpu).startswith(prefix)


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
