"""This host's peak vector throughput, measured in the run that uses it.

The board projection of the vision bench (vision_ttft.py) scales each measured time by the
board's peak over this host's; this module gives the host's side. A table of nominal figures
(one 512-bit FMA and one vpdpbusd a cycle at a guest's nominal clock) can be off by several
times on a server core with two 512-bit ports and turbo (docs/kernels.md,
docs/microbench/dot_rate.c): hence measured.

Two loops of CHAINS independent accumulators (more than latency x throughput of either
instruction on the cores we know), written as LLVM IR so that the instructions are the ones
the kernels use:

- f32: fma of the class's vector width (16 floats with AVX-512 VNNI, 8 elsewhere) with a
  float broadcast from memory;
- int8: the class's 4-byte dot (kernels/dots.py dot4: vpdpbusd, sdot, the AVX2 pair, plain
  IR) with an activation word broadcast from memory, as in the grouped weight kernels.

The broadcasts' address passes through an empty inline-asm barrier every step, so LLVM can
neither hoist the loads nor treat a product as loop-invariant. Multiply-adds count 2 ops.
"""

from __future__ import annotations

import time

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..kernels import dots
from ..kernels.irtools import F32, I8, I32, splat, vec
from ..kernels.target import TARGET

CHAINS = 12
LANES = TARGET.group  # int32 / f32 lanes of one accumulator, as in the grouped kernels
I64 = ir.IntType(64)


def _opaque_pointer(builder, ptr):
    """ptr, unknown to LLVM from here on (an empty asm that may change it)."""
    fnty = ir.FunctionType(ptr.type, [ptr.type])
    return builder.call(ir.InlineAsm(fnty, "", "=r,0", side_effect=True), [ptr])


def _chain_loop(builder, n, acc_type, step):
    """CHAINS accumulators of acc_type, zero, through n steps acc_c = step(builder, acc_c, c,
    base), base a fresh opaque pointer to a small scratch each step; returns the sum of every
    lane of every accumulator (so that no lane is dead)."""
    scratch = cgutils.alloca_once(builder, ir.ArrayType(I32, 4 * CHAINS))
    one = 0x3F800000  # float 1.0 (ints 1 would be float denormals: microcode-slow)
    builder.store(ir.Constant(scratch.type.pointee, [one] * 4 * CHAINS), scratch)
    start = builder.bitcast(scratch, I8.as_pointer())
    before = builder.block
    loop = builder.append_basic_block("peak.loop")
    done = builder.append_basic_block("peak.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i = builder.phi(I64)
    base = builder.phi(start.type)
    accs = [builder.phi(acc_type) for _ in range(CHAINS)]
    moved = _opaque_pointer(builder, base)
    new = [step(builder, acc, c, moved) for c, acc in enumerate(accs)]
    following = builder.add(i, I64(1))
    builder.cbranch(builder.icmp_signed("<", following, n), loop, done)
    i.add_incoming(I64(0), before)
    i.add_incoming(following, loop)
    base.add_incoming(start, before)
    base.add_incoming(moved, loop)
    for acc, value in zip(accs, new):
        acc.add_incoming(ir.Constant(acc_type, [acc_type.element(0)] * acc_type.count), before)
        acc.add_incoming(value, loop)
    builder.position_at_end(done)
    add = builder.fadd if isinstance(acc_type.element, ir.FloatType) else builder.add
    total = new[0]
    for value in new[1:]:
        total = add(total, value)
    lanes = builder.extract_element(total, I32(0))
    for lane in range(1, acc_type.count):
        lanes = add(lanes, builder.extract_element(total, I32(lane)))
    return lanes


def _broadcast(builder, base, c, elem, count):
    ptr = builder.bitcast(builder.gep(base, [I32(4 * c)]), elem.as_pointer())
    return splat(builder, builder.load(ptr), vec(elem, count))


@intrinsic
def _fma_loop(typingctx, n):
    vt = vec(F32, LANES)

    def step(builder, acc, c, base):
        x = _broadcast(builder, base, c, F32, LANES)
        fnty = ir.FunctionType(vt, [vt, vt, vt])
        fma = builder.module.declare_intrinsic(f"llvm.fma.v{LANES}f32", fnty=fnty)
        return builder.call(fma, [x, ir.Constant(vt, [0.999] * LANES), acc])

    def codegen(context, builder, signature, args):
        return _chain_loop(builder, args[0], vt, step)

    return types.float32(types.int64), codegen


@intrinsic
def _dot_loop(typingctx, n):
    at = vec(I32, LANES)
    weights = ir.Constant(vec(I8, 4 * LANES), [3] * 4 * LANES)

    def step(builder, acc, c, base):
        word = builder.bitcast(_broadcast(builder, base, c, I32, LANES), weights.type)
        return dots.dot4(builder, acc, weights, word)

    def codegen(context, builder, signature, args):
        return _chain_loop(builder, args[0], at, step)

    return types.int32(types.int64), codegen


@njit(nogil=True, cache=True, parallel=True)
def _run_fma(n, threads, out):
    for t in prange(threads):
        out[t] = _fma_loop(n)


@njit(nogil=True, cache=True, parallel=True)
def _run_dot(n, threads, out):
    for t in prange(threads):
        out[t] = _dot_loop(n)


def _rate(run, ops_per_step: int, threads: int, seconds: float) -> float:
    """Ops/s of `threads` threads each running its own loop: the best of 5 timings."""
    out = np.zeros(max(threads, 1), np.float64)
    run(1000, threads, out)  # compiles or loads
    n = 1000
    while True:  # steps for about `seconds`
        t0 = time.perf_counter()
        run(n, threads, out)
        if time.perf_counter() - t0 > seconds / 5 or n > 1 << 40:
            break
        n *= 4
    best = min(_timed(run, n, threads, out) for _ in range(5))
    return n * CHAINS * ops_per_step * threads / best


def _timed(run, n, threads, out) -> float:
    t0 = time.perf_counter()
    run(n, threads, out)
    return time.perf_counter() - t0


def measure(seconds: float = 0.2) -> dict:
    """Peak G ops/s: {"f32": ..., "int8": ...} with all threads and per core (one thread),
    and the lanes and threads they were measured with."""
    threads = get_num_threads()
    f32_ops, int8_ops = 2 * LANES, 2 * 4 * LANES  # per accumulator step
    return {
        "threads": threads,
        "lanes": LANES,
        "dot": TARGET.dot,
        "f32": _rate(_run_fma, f32_ops, threads, seconds) / 1e9,
        "int8": _rate(_run_dot, int8_ops, threads, seconds) / 1e9,
        "f32_core": _rate(_run_fma, f32_ops, 1, seconds) / 1e9,
        "int8_core": _rate(_run_dot, int8_ops, 1, seconds) / 1e9,
    }


if __name__ == "__main__":
    print(measure())
