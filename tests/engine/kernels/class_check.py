"""Run in a subprocess by test_classes.py, with the environment naming a CPU class:

    python class_check.py EXPECTED_CLASS OUT.npz

Checks, for the grouped q4, q8 and q8a8 kernels, the row-major q8 kernel and int8 attention
built for that class: rows of N-row calls bitwise equal to 1-row calls (N = 1..9, 1 and 2
threads), agreement with the NumPy twins, the int16 bounds of the AVX2/NEON dots at their
extremes (largest nibbles and q8a8 weights against +-127 activations); for the vision
encoder's fused int8 attention, closeness to exact softmax attention and the same bits on 1
and 2 threads; then saves the outputs (for the cross-class comparison) and the assembly's
instruction counts (and which q4 tiles' dots take a base + index operand). Prints "class ok".
"""

import json
import re
import sys
from collections import Counter

import numba
import numpy as np
from test_span_attention import cosine, exact, on_1_and_2_threads  # this folder: sys.path[0]

from merlin.engine.kernels import attention as at
from merlin.engine.kernels import qgroup, qlinear, reference
from merlin.engine.kernels import span_attention as span
from merlin.engine.kernels.target import TARGET
from merlin.engine.quant import QTensor, quantize_q4, quantize_q8

expected, out_path = sys.argv[1], sys.argv[2]
assert TARGET.name == expected, (TARGET.name, expected)
assert qgroup.GROUP == TARGET.group
rng = np.random.default_rng(5)
results = {}


def check_rows(name, matmul, x, args, o):
    singles = np.empty((len(x), o), np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        for i in range(len(x)):
            matmul(x[i : i + 1], *args, singles[i : i + 1])
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            for n in range(1, len(x) + 1):
                out = np.empty((n, o), np.float32)
                matmul(np.ascontiguousarray(x[:n]), *args, out)
                assert np.array_equal(out, singles[:n]), (name, threads, n)
    finally:
        numba.set_num_threads(before)
    results[name] = singles
    return singles


GROUPED = (
    ("q4", quantize_q4, qgroup.pack_q4_groups, qgroup.matmul_q4g, reference.matmul_q4g_reference),
    ("q8", quantize_q8, qgroup.pack_q8_groups, qgroup.matmul_q8g, reference.matmul_q8g_reference),
    (
        "q8a8",
        quantize_q8,
        qgroup.pack_q8a8_groups,
        qgroup.matmul_q8a8g,
        reference.matmul_q8a8g_reference,
    ),
)
x = rng.standard_normal((9, 96), dtype=np.float32)
for name, quantize, pack, matmul, twin in GROUPED:
    qt = quantize(rng.standard_normal((21, 96), dtype=np.float32))
    singles = check_rows(name, matmul, x, pack(qt.qs, qt.scales), 21)
    ref = twin(x, qt.qs, qt.scales)
    assert np.abs(singles - ref).max() <= 1e-5 * np.abs(ref).max(), name

# Extremes: every nibble 15 (q = +7) and every q8a8 weight -128 or 127, activations +-127
# (x = +-1 in whole blocks): the int16 sums of the AVX2 / NEON forms at their largest.
k = 64
scales = np.full((16, k // 32), 0x3F80, np.uint16)  # bf16 1.0
signs = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32)
x_ext = np.stack([np.ones(k, np.float32), -np.ones(k, np.float32), signs]).astype(np.float32)
q4 = QTensor("q4", np.full((16, k // 2), 0xFF, np.uint8), scales)
q8_hi = np.full((16, k), 127, np.int8)
q8_hi[::2] = -128
q8 = QTensor("q8", q8_hi, scales)
for name, qt, pack, matmul, twin in (
    ("q4-ext", q4, qgroup.pack_q4_groups, qgroup.matmul_q4g, reference.matmul_q4g_reference),
    (
        "q8a8-ext",
        q8,
        qgroup.pack_q8a8_groups,
        qgroup.matmul_q8a8g,
        reference.matmul_q8a8g_reference,
    ),
    ("q8-ext", q8, qgroup.pack_q8_groups, qgroup.matmul_q8g, reference.matmul_q8g_reference),
):
    out = check_rows(name, matmul, x_ext, pack(qt.qs, qt.scales), 16)
    ref = twin(x_ext, qt.qs, qt.scales)
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max(), (name, out, ref)

qt = quantize_q8(rng.standard_normal((37, 96), dtype=np.float32))
singles = check_rows("q8-rowmajor", qlinear.matmul_q8, x, (qt.qs, qt.scales), 37)
ref = reference.matmul_q8_small_reference(x, qt.qs, qt.scales)
assert np.abs(singles - ref).max() <= 1e-5 * np.abs(ref).max()

# int8 attention (its pair dots come from dots.dot2 too)
kq = rng.integers(-127, 128, (2, 2, 64, 128), dtype=np.int8)
v = rng.integers(-127, 128, (2, 80, 128), dtype=np.int8)
ks = np.full((2, 80), 0.01, np.float32)
q = rng.standard_normal((5, 4, 128), dtype=np.float32)
single = np.empty((5, 512), np.float32)
for i in range(5):
    at.attention(q[i : i + 1], kq, ks, v, ks, 70 + i, np.float32(0.1), single[i : i + 1])
batch = np.empty((5, 512), np.float32)
at.attention(q, kq, ks, v, ks, 70, np.float32(0.1), batch)
assert np.array_equal(batch, single)
ref = reference.attention_reference(q, kq, ks, v, ks, 70, 0.1)
assert np.abs(batch - ref).max() < 1e-4 * np.abs(ref).max()
results["attention-q8"] = batch
if not TARGET.x86_ir:  # the f32 cache with NEON-sized tiles (x86's: the in-process tests)
    kf = rng.standard_normal((2, 2, 128, 64), dtype=np.float32)  # 80 keys in tiles of 64
    vf = rng.standard_normal((2, 80, 128), dtype=np.float32)
    ones = np.ones((2, 80), np.float32)
    for i in range(5):
        at.attention(q[i : i + 1], kf, ones, vf, ones, 70 + i, np.float32(0.1), single[i : i + 1])
    at.attention(q, kf, ones, vf, ones, 70, np.float32(0.1), batch)
    assert np.array_equal(batch, single)
    ref = reference.attention_reference(q, kf, ones, vf, ones, 70, 0.1)
    assert np.abs(batch - ref).max() < 1e-4 * np.abs(ref).max()


# the q8 vision encoder's fused int8 attention (its score and value dots are dots.dot4):
# against exact softmax attention, the same bits with 1 and 2 threads; q and k of one
# magnitude with mixed signs quantize to +-127 exactly (the AVX2 pair sums at their largest)
signs = np.where(rng.random((2, 70, 72)) < 0.5, -1.0, 1.0).astype(np.float32)
for name, (q, k) in (
    ("span-attention", (rng.standard_normal((2, 2, 70, 72), dtype=np.float32))),
    ("span-attention-ext", (signs * 0.3, signs[:, ::-1] * 0.3)),
):
    q, k = np.ascontiguousarray(q), np.ascontiguousarray(k)
    v = rng.standard_normal((2, 70, 72), dtype=np.float32)
    outs = on_1_and_2_threads(q, k, v, 0.125)
    assert np.array_equal(outs[0], outs[1]), name
    cos = cosine(outs[0], exact(q, k, v, 0, 70, 0.125))
    assert cos >= 0.9995, (name, cos)
    results[name] = outs[0]

shapes = {
    "qlinear_tile": [qlinear.TILE_ROWS, qlinear.TILE_OUT],
    "attention_tiles": [at.SCORE_QUERIES, at.SCORE_KEYS, at.VALUE_QUERIES, at.DIM_BLOCK],
    "group": qgroup.GROUP,
    "q8a8_bias": qgroup.Q8A8_BIAS,
}
print("shapes " + json.dumps(shapes))

MNEMONIC = re.compile(r"^\s*(\{vex\}\s+)?([a-z][a-z0-9.]*)\s+(.*)$", re.M)
counts = Counter()
for fn in (qgroup.matmul_q4g, qgroup.matmul_q8a8g, qgroup.matmul_q8g, span.span_attention):
    for sig in fn.signatures:
        for m in MNEMONIC.finditer(fn.inspect_asm(sig)):
            name = ("{vex} " if m.group(1) else "") + m.group(2)
            regs = m.group(3)
            counts[name] += 1
            if "zmm" in regs:
                counts["<zmm>"] += 1
            if "ymm" in regs:
                counts["<ymm>"] += 1


def tiles_with_indexed_dots(asm: str, dot: str, per_row: int) -> list[int]:
    """Rows (dots / per_row) of the tile loops (innermost loops: a label, a backward jump to
    it, no loop inside) whose `dot`s take a base + index operand (un-laminated on Intel:
    qgroup.own_row_pointers)."""
    lines = asm.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.\w+):", ln))}
    loops = []
    for i, ln in enumerate(lines):
        m = re.match(r"\s+j\w+\s+(\.\w+)", ln)
        if m and labels.get(m.group(1), i) < i:
            loops.append((labels[m.group(1)], i))
    rows = set()
    for start, end in loops:
        if any(start < s < end for s, _ in loops):
            continue  # an outer loop
        dots = [b for b in lines[start:end] if dot in b]
        if dots and any(re.search(r"\(%\w+,%\w+", d) for d in dots):
            rows.add(len(dots) // per_row)
    return sorted(rows)


for kind, fn, dot, per_row in (
    ("q4", qgroup.matmul_q4g, "vpdpbusd", 8),
    ("q8", qgroup.matmul_q8g, "vpdpwssd", 16),
):
    listings = [fn.inspect_asm(sig) for sig in fn.signatures]
    rows = {r for asm in listings for r in tiles_with_indexed_dots(asm, dot, per_row)}
    counts[f"<{kind} tiles with indexed dots>"] = sorted(rows)
np.savez(out_path, **results)
print("asm " + json.dumps(counts))
print("class ok")
