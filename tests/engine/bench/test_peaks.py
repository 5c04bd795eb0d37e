"""The host's peak throughput probe (bench/peaks.py) that the vision board projection scales by."""

from merlin.engine.bench import peaks
from merlin.engine.kernels.target import TARGET


def test_peaks_are_measured_and_the_int8_dots_beat_f32():
    p = peaks.measure(seconds=0.02)
    assert p["lanes"] == TARGET.group and p["dot"] == TARGET.dot and p["threads"] >= 1
    for key in ("f32", "int8", "f32_core", "int8_core"):
        assert 0 < p[key] < 1e6, (key, p)  # G ops/s: some, and not a loop LLVM deleted
    if TARGET.dot in ("vnni", "sdot", "avx2"):  # 4 products a 32-bit lane per dot
        assert p["int8_core"] > p["f32_core"], p
