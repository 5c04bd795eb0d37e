"""Why a verify of 4 drafts costs more than 1.25 plain steps on a 2-core host: the grouped
products' rate (GB/s of weights) for 1 and 5 activation rows, (a) on one matrix of the 2B's
shapes that stays in cache (compute alone), 1 and 2 threads; (b) over all the loaded 2B
random checkpoint's matrices of that format, read from DRAM, 2 threads, 1 and 5 rows
alternating, medians of 7 (docs/benchmarks.md, "Session 31").

    python docs/microbench/verify_rates.py q4        # or q8; the CPU class as detected, or
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= python docs/microbench/verify_rates.py q4

If five rows computed from cache at 2 threads run slower than the host reads weights, V(4)
cannot reach 1.25 T whatever the overlap; the DRAM figures show how much of it is left.
"""

import sys
import time

import numba
import numpy as np

from merlin.engine.demo import QWEN3VL_2B, ensure_random_checkpoint
from merlin.engine.kernels import qgroup
from merlin.engine.kernels.target import TARGET
from merlin.engine.linear import GroupLinear
from merlin.engine.model import load_model

FMT = sys.argv[1] if len(sys.argv) > 1 else "q4"
MATMUL = {"q4": qgroup.matmul_q4g, "q8": qgroup.matmul_q8g}[FMT]
rng = np.random.default_rng(0)


def median_seconds(fn, rounds=7, calls=1):
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls)
    return float(np.median(times))


def cached(o: int, k: int) -> None:
    scales = np.full((o, k // 32), 0x3C00, np.uint16)
    if FMT == "q4":
        packed = qgroup.pack_q4_groups(rng.integers(0, 256, (o, k // 2), dtype=np.uint8), scales)
    else:
        packed = qgroup.pack_q8_groups(rng.integers(-127, 128, (o, k), dtype=np.int8), scales)
    gb = (packed[0].nbytes + packed[1].nbytes) / 1e9
    for n in (1, 5):
        x = rng.standard_normal((n, k)).astype(np.float32)
        out = np.empty((n, o), np.float32)
        rates = []
        for threads in (1, 2):
            numba.set_num_threads(threads)
            seconds = median_seconds(lambda x=x, out=out: MATMUL(x, *packed, out), calls=50)
            rates.append(gb / seconds)
        print(f"cached {o}x{k} N={n}: {rates[0]:.1f} GB/s on 1 thread, {rates[1]:.1f} on 2")


def from_dram() -> None:
    numba.set_num_threads(2)
    model = load_model(ensure_random_checkpoint(QWEN3VL_2B), weights=FMT, kv="q8")
    mats = [m for m in model.text.w.matrices() if isinstance(m, GroupLinear) and m.kind == FMT]
    gb = sum(m.packed.nbytes + m.gscales.nbytes for m in mats) / 1e9
    data = {
        n: [
            (rng.standard_normal((n, m.in_features)).astype(np.float32),
             np.empty((n, m.out_features), np.float32))
            for m in mats
        ]
        for n in (1, 5)
    }  # fmt: skip

    def step(n):
        t = time.perf_counter()
        for m, (x, out) in zip(mats, data[n]):
            m(x, out)
        return time.perf_counter() - t

    step(1), step(5)
    times = {1: [], 5: []}
    for r in range(7):
        for n in (1, 5) if r % 2 else (5, 1):
            times[n].append(step(n))
    one, five = np.median(times[1]), np.median(times[5])
    print(
        f"DRAM, all {len(mats)} {FMT} matrices ({gb:.2f} GB), 2 threads: 1 row {one * 1e3:.1f} ms "
        f"({gb / one:.1f} GB/s), 5 rows {five * 1e3:.1f} ms ({gb / five:.1f} GB/s), "
        f"ratio {five / one:.2f}"
    )


print(TARGET.describe())
for shape in ((6144, 2048), (2048, 6144)):
    cached(*shape)
from_dram()
