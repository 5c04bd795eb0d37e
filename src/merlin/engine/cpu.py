"""Thread placement: which CPUs the kernels run on, and how many kernel threads.

On a big.LITTLE CPU (RK3588: 4x Cortex-A76 + 4x Cortex-A55) the kernels split their rows evenly
over the threads, so one thread on a slow core makes every parallel kernel wait for it: running
on the big cores only is faster than running on all eight. Merlin therefore detects the big
cores and by default pins the process to them, with one kernel thread per big core.

Detection reads Linux sysfs (`/sys/devices/system/cpu`):

1. `cpuN/cpu_capacity` (arm64 and recent x86 hybrid kernels: the scheduler's relative
   performance, 1024 for the fastest core; RK3588 A76 = 1024, A55 = about 414);
2. otherwise `cpuN/cpufreq/cpuinfo_max_freq` (kHz);
3. otherwise nothing is known: every CPU counts.

The "big" cores are those whose figure lies above the midpoint between the slowest and the
fastest core (so a prime + big + little SoC keeps its prime and big cores). Equal figures mean
a uniform CPU: all cores are used. The choice is always intersected with the CPUs this process
may run on (`os.sched_getaffinity`, e.g. a container's cpuset).

`--cpus all|big|LIST` (LIST like `0-3,6`) and `--threads N` override it; `merlin-cli info`
prints what was chosen.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError

SYSFS_CPU = "/sys/devices/system/cpu"
CPU_MODES = ("big", "all")


@dataclass(frozen=True)
class CpuTopology:
    """What sysfs says about the CPUs: one figure per CPU (capacity or max kHz) or none."""

    cpus: tuple[int, ...]  # online CPUs
    figures: dict[int, int] = field(default_factory=dict)  # cpu -> capacity or max kHz
    source: str = "none"  # "cpu_capacity", "cpuinfo_max_freq" or "none"

    @property
    def uniform(self) -> bool:
        return len(set(self.figures.values())) <= 1

    def big_cores(self) -> tuple[int, ...]:
        """The fast cores (all CPUs when the CPU is uniform or nothing is known)."""
        if self.source == "none" or self.uniform:
            return self.cpus
        lo, hi = min(self.figures.values()), max(self.figures.values())
        mid = (lo + hi) / 2
        return tuple(c for c in self.cpus if self.figures.get(c, hi) > mid)

    def describe(self) -> str:
        if self.source == "none":
            return f"{len(self.cpus)} CPUs, no capacity or frequency information"
        unit = "capacity" if self.source == "cpu_capacity" else "max kHz"
        groups: dict[int, list[int]] = {}
        for c in self.cpus:
            groups.setdefault(self.figures.get(c, -1), []).append(c)
        parts = [
            f"{format_cpu_list(cs)} ({unit} {fig})"
            for fig, cs in sorted(groups.items(), key=lambda kv: -kv[0])
        ]
        kind = "uniform" if self.uniform else "heterogeneous"
        return f"{len(self.cpus)} CPUs, {kind}: " + ", ".join(parts)


@dataclass(frozen=True)
class Placement:
    mode: str  # "big", "all" or "list"
    cpus: tuple[int, ...]  # the CPUs the process runs on
    threads: int  # kernel threads
    topology: CpuTopology
    note: str = ""  # why the choice differs from what was asked, if it does

    def describe(self) -> str:
        what = {
            "big": "big cores" if len(self.cpus) < len(self.topology.cpus) else "all cores",
            "all": "all cores",
            "list": "CPUs as given",
        }[self.mode]
        text = (
            f"{what}: CPUs {format_cpu_list(self.cpus)}, {self.threads} kernel thread"
            f"{'s' if self.threads != 1 else ''} (--cpus {self.mode})"
        )
        return text + (f"; {self.note}" if self.note else "")


# ---------------------------------------------------------------------------- parsing


def parse_cpu_list(text: str, name: str = "CPU list") -> tuple[int, ...]:
    """'0-3,6' -> (0, 1, 2, 3, 6), bounded (engine.limits.cpu_list). Raises InputError on
    anything else."""
    from .limits import cpu_list

    return cpu_list(text, name)


def format_cpu_list(cpus) -> str:
    """(0, 1, 2, 3, 6) -> '0-3,6'."""
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out) or "none"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_topology(root: str | os.PathLike = SYSFS_CPU) -> CpuTopology:
    """The online CPUs and their capacity (or max frequency) from a sysfs cpu folder."""
    root = Path(root)
    cpus: tuple[int, ...] = ()
    try:
        cpus = parse_cpu_list((root / "online").read_text())
    except (OSError, InputError):
        try:
            cpus = tuple(
                sorted(
                    int(p.name[3:])
                    for p in root.iterdir()
                    if p.name.startswith("cpu") and p.name[3:].isdigit()
                )
            )
        except OSError:
            cpus = ()
    if not cpus:
        cpus = tuple(range(os.cpu_count() or 1))
    for source, rel in (
        ("cpu_capacity", "cpu_capacity"),
        ("cpuinfo_max_freq", "cpufreq/cpuinfo_max_freq"),
    ):
        figures = {c: v for c in cpus if (v := _read_int(root / f"cpu{c}" / rel)) is not None}
        if len(figures) == len(cpus):  # a partial view would misjudge the missing cores
            return CpuTopology(cpus, figures, source)
    return CpuTopology(cpus)


def allowed_cpus() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


# ---------------------------------------------------------------------------- choosing


def choose(
    cpus: str = "big",
    threads: int | None = None,
    *,
    topology: CpuTopology | None = None,
    allowed: tuple[int, ...] | None = None,
) -> Placement:
    """The placement for `--cpus` (big, all or a list) and `--threads` (None or 0: one per CPU)."""
    topo = topology if topology is not None else read_topology()
    allowed_set = set(allowed if allowed is not None else allowed_cpus())
    spec = (cpus or "big").strip().lower()
    note = ""
    if spec == "all":
        mode, wanted = "all", topo.cpus
    elif spec == "big":
        mode, wanted = "big", topo.big_cores()
    else:
        mode, wanted = "list", parse_cpu_list(spec, "--cpus / MERLIN_CPUS")
        unknown = sorted(set(wanted) - set(topo.cpus))
        if unknown:
            raise InputError(
                f"CPU {format_cpu_list(unknown)} does not exist here "
                f"(this machine has CPUs {format_cpu_list(topo.cpus)})."
            )
    chosen = tuple(c for c in wanted if c in allowed_set)
    if not chosen:
        chosen = tuple(sorted(allowed_set)) or topo.cpus
        note = f"CPUs {format_cpu_list(wanted)} are not available to this process"
    elif len(chosen) < len(wanted):
        note = f"CPUs {format_cpu_list(sorted(set(wanted) - set(chosen)))} not available"
    if threads is not None:
        from .limits import threads as check_threads

        threads = check_threads(threads, "threads (--threads / MERLIN_THREADS)")
    n = threads or len(chosen)
    return Placement(mode, chosen, n, topo, note)


# ---------------------------------------------------------------------------- applying


def _pin(cpus: tuple[int, ...]) -> None:
    """Pin the process: every existing thread (BLAS threads already started by NumPy too) and,
    through the calling thread, every thread started later."""
    target = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, target)
        except OSError:
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, target)


_BLAS_SETTER = None  # the OpenBLAS set_num_threads found by _blas_setter, once found


def _blas_setter():
    """OpenBLAS's set_num_threads in a library NumPy loaded, or None. Found once: reading
    /proc/self/maps took 1.5 ms a call, and the vision attention calls this twice a block."""
    global _BLAS_SETTER
    if _BLAS_SETTER is not None:
        return _BLAS_SETTER
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in (
            "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_",
            "openblas_set_num_threads",
        ):
            fn = getattr(lib, name, None)
            if fn is not None:
                _BLAS_SETTER = fn
                return fn
    return None


def set_blas_threads(n: int) -> bool:
    """Best effort: tell an OpenBLAS that NumPy loaded to use n threads (prefill GEMMs)."""
    fn = _blas_setter()
    if fn is None:
        return False
    fn(ctypes.c_int(n))
    return True


def apply(placement: Placement) -> Placement:
    """Pin the process to the placement's CPUs and set the kernel (and BLAS) thread count."""
    if hasattr(os, "sched_setaffinity"):
        try:
            _pin(placement.cpus)
        except OSError:
            pass
    from .threads import set_threads

    set_threads(placement.threads)
    set_blas_threads(min(placement.threads, len(placement.cpus)))
    return placement


def place(cpus: str | None = None, threads: int | None = None) -> Placement:
    """choose() + apply(): what the entry points call before running kernels.
    MERLIN_CPUS and MERLIN_THREADS are the defaults when no flag is given."""
    if cpus is None:
        cpus = os.environ.get("MERLIN_CPUS") or "big"
    if threads is None and os.environ.get("MERLIN_THREADS", "").strip():
        from .limits import threads as check_threads

        threads = check_threads(os.environ["MERLIN_THREADS"], "MERLIN_THREADS")
    return apply(choose(cpus, threads))
