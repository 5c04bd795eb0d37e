"""engine/hugepages.py: arrays carved from one huge-page mapping (the weight cache's)."""

import re
from pathlib import Path

import numpy as np
import pytest

from merlin.engine.hugepages import ALIGN, HUGE_PAGE, Arena, arena_bytes


def test_arrays_are_aligned_separate_and_keep_their_values():
    rng = np.random.default_rng(0)
    parts = [
        rng.integers(0, 255, (300, 7), dtype=np.uint8),
        rng.standard_normal((5, 3), dtype=np.float32),
        rng.integers(-9, 9, 1001, dtype=np.int16),
    ]
    arena = Arena(arena_bytes(parts))
    copies = [arena.copy(a) for a in parts]
    assert copies[0].ctypes.data % HUGE_PAGE == 0  # the first array starts a huge page
    for a, c in zip(parts, copies):
        assert c.ctypes.data % ALIGN == 0 and c.flags.c_contiguous and c.flags.writeable
        assert c.dtype == a.dtype and np.array_equal(a, c)
    copies[1][...] = 0  # neighbours do not overlap
    assert np.array_equal(copies[0], parts[0]) and np.array_equal(copies[2], parts[2])


def test_views_outlive_the_arena_object_and_a_full_arena_says_so():
    arena = Arena(1000)
    a = arena.take((10, 10), np.float64)  # 800 bytes
    a[...] = 3.0
    with pytest.raises(MemoryError, match="arena full"):
        arena.take((4 * HUGE_PAGE,), np.uint8)
    del arena
    assert a.sum() == 300.0  # the mapping lives as long as a view of it


def _thp_mode() -> str:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    found = re.search(r"\[(\w+)\]", path.read_text()) if path.exists() else None
    return found.group(1) if found else "absent"


def _huge_kb_at(address: int) -> int:
    huge, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            huge += int(line.split()[1])
    return huge


def test_the_arena_is_on_huge_pages_where_the_kernel_offers_them():
    arena = Arena(8 * HUGE_PAGE)
    a = arena.take((8 * HUGE_PAGE,), np.uint8)
    a[::4096] = 1  # touch every page
    if _thp_mode() in ("always", "madvise"):
        assert _huge_kb_at(a.ctypes.data) >= 2048
    else:  # THP off or not Linux: ordinary pages, the same arrays
        assert a.sum() == 8 * HUGE_PAGE // 4096
