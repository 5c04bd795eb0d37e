"""Routed experts of a mixture-of-experts layer: the router, tokens grouped by expert, and
each selected expert's SwiGLU MLP through the dense matmul kernels, in one compiled call.

Layout: one layer's experts are stacked along a leading axis E, in the form the dense kernels
take for one matrix (engine.linear), so expert e's matrix is the C-contiguous view [e]:

    f32   w        f32  [E, O, K]                 matmul_f32
    q4    packed   u8   [E, O/G, K/32, 16 G]      qgroup.experts_q4g  (gscales [E, O/G, K/32, G])
    q8    packed   i8   [E, O/G, K/32, 32 G]      qgroup.experts_q8g  (grouped q8, VNNI CPUs)
    q8r   qs i8 [E, O, K], scales u16 [E, O, K/32]  qlinear.matmul_q8 (row-major q8 elsewhere)

gate_up is [2I, D] per expert (gate rows then up rows), down [D, I].

A forward of N rows (decode N = 1, verify K + 1, prefill):
  1. router logits [N, E] = x @ router.T (matmul_f32: every output one dot in a fixed order);
  2. route: per row, softmax in f32 (as torch's softmax(dtype=float)), the top k by
     probability, ties to the lower expert index, renormalised when norm_topk_prob;
  3. the N k (row, slot) pairs sorted by expert (a counting sort, stable in row order), and
     for each expert with rows: its rows gathered, gate_up, silu_mul, down: each selected
     expert's weights are read once per forward, however many rows chose it;
  4. out[n] = sum over slots s = 0..k-1 of weight[n, s] * y[n, s], in slot order.

Bitwise contract: each of the four steps computes a row from that row alone, in an order that
does not depend on N or on which other rows chose the same expert (the matmul kernels' own
contract: a row of an M-row call equals a 1-row call), so row n of an N-row forward is bitwise
equal to a 1-row forward of that row (tests/engine/test_moe.py).

Why one compiled call per layer: decode runs 2 k matrix products per layer (16 for k = 8, 768
over 48 layers). From Python each costs a dispatch and the gathers around it. The grouped q4
and q8 forms go further: all chosen experts' gate_up products are one parallel region over
(expert, group) tasks, and their down products another (qgroup.experts_q4g / experts_q8g),
since one region a product costs a thread wake-up 16 times a layer on matrices of 0.9-1.8 MB.
Measured on the 30B-A3B widths (docs/moe.md): a decode row's experts 2.2x faster than running
the experts in parallel with each product on one thread (nested OpenMP regions
oversubscribed the cores). The f32 and row-major q8 forms run the experts one after another,
each product parallel over its rows.
The matmul kernels are called through their public entry points (qgroup's experts_q4g /
experts_q8g, linear's matmul_f32, qlinear's matmul_q8), so CPU-specific variants of them
apply here unchanged.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .activation import silu_mul
from .linear import matmul_f32
from .qgroup import experts_grouped
from .qlinear import matmul_q8


@njit(nogil=True, cache=True)
def route(logits, k, normalize, idx, weights):
    """logits [N, E] f32 -> idx [N, k] int64 (by descending probability), weights [N, k] f32.

    softmax as torch computes it in f32 (max subtracted, exp, divided by the sum); the top k
    by a selection that keeps the lower index on ties; renormalised over the k when
    `normalize` (division by their f32 sum)."""
    n_rows, n_experts = logits.shape
    probs = np.empty(n_experts, np.float32)
    taken = np.zeros(n_experts, np.bool_)
    for n in range(n_rows):
        m = logits[n, 0]
        for e in range(1, n_experts):
            if logits[n, e] > m:
                m = logits[n, e]
        total = np.float32(0.0)
        for e in range(n_experts):
            p = np.float32(np.exp(np.float32(logits[n, e] - m)))
            probs[e] = p
            total += p
        for e in range(n_experts):
            probs[e] = probs[e] / total
            taken[e] = False
        top_sum = np.float32(0.0)
        for s in range(k):
            best = -1
            for e in range(n_experts):
                if not taken[e] and (best < 0 or probs[e] > probs[best]):
                    best = e
            taken[best] = True
            idx[n, s] = best
            weights[n, s] = probs[best]
            top_sum += probs[best]
        if normalize:
            for s in range(k):
                weights[n, s] = weights[n, s] / top_sum


@njit(nogil=True, cache=True)
def group_by_expert(idx, n_experts, starts, pairs):
    """Counting sort of the (row, slot) pairs of idx [N, k] by expert, stable in (row, slot)
    order: pairs [N k, 2] (row, slot); expert e's pairs are pairs[starts[e] : starts[e + 1]].
    Returns how many experts have at least one row."""
    n_rows, k = idx.shape
    counts = np.zeros(n_experts, np.int64)
    for n in range(n_rows):
        for s in range(k):
            counts[idx[n, s]] += 1
    starts[0] = 0
    used = 0
    for e in range(n_experts):
        starts[e + 1] = starts[e] + counts[e]
        if counts[e]:
            used += 1
    fill = starts[:-1].copy()
    for n in range(n_rows):
        for s in range(k):
            e = idx[n, s]
            pairs[fill[e], 0] = n
            pairs[fill[e], 1] = s
            fill[e] += 1
    return used


@njit(nogil=True, cache=True)
def _gather(x, pairs, p0, p1, xs):
    for i in range(p1 - p0):
        xs[i] = x[pairs[p0 + i, 0]]


@njit(nogil=True, cache=True)
def _scatter(y, pairs, p0, p1, ys):
    for i in range(p1 - p0):
        ys[pairs[p0 + i, 0], pairs[p0 + i, 1]] = y[i]


@njit(nogil=True, cache=True)
def combine(ys, weights, out):
    """out[n] = sum_s weights[n, s] * ys[n, s] in slot order (ys [N, k, D])."""
    n_rows, k, d = ys.shape
    for n in range(n_rows):
        for j in range(d):
            acc = np.float32(0.0)
            for s in range(k):
                acc += weights[n, s] * ys[n, s, j]
            out[n, j] = acc


@njit(nogil=True, cache=True)
def _plan(x, router, k, normalize):
    n_rows = x.shape[0]
    n_experts = router.shape[0]
    logits = np.empty((n_rows, n_experts), np.float32)
    matmul_f32(x, router, logits)
    idx = np.empty((n_rows, k), np.int64)
    weights = np.empty((n_rows, k), np.float32)
    route(logits, k, normalize, idx, weights)
    starts = np.empty(n_experts + 1, np.int64)
    pairs = np.empty((n_rows * k, 2), np.int64)
    used = group_by_expert(idx, n_experts, starts, pairs)
    return idx, weights, starts, pairs, used


@njit(nogil=True, cache=True)
def _chosen(starts, used):
    """The experts with at least one row, ascending."""
    out = np.empty(used, np.int64)
    j = 0
    for e in range(starts.shape[0] - 1):
        if starts[e + 1] > starts[e]:
            out[j] = e
            j += 1
    return out


# One entry point per weight form (Numba specialises per argument types; the forms differ in
# their arrays). Each returns (idx [N, k], weights [N, k], experts used) and writes the MLP
# output to out [N, D]; inter is the experts' intermediate size, threads Numba's thread count
# (an argument: numba.get_num_threads() inside would keep the function out of the disk
# cache). Each expert writes only its own (row, slot) outputs.


@njit(nogil=True, cache=True)
def _gather_all(x, pairs):
    """x's row of every (row, slot) pair, in pair order: [N k, D]."""
    xs = np.empty((pairs.shape[0], x.shape[1]), np.float32)
    _gather(x, pairs, 0, pairs.shape[0], xs)
    return xs


@njit(nogil=True, cache=True)
def _runs(starts, chosen):
    """The pair ranges of the chosen experts: run j is pairs[runs[j] : runs[j + 1]]."""
    runs = np.empty(chosen.shape[0] + 1, np.int64)
    for j in range(chosen.shape[0]):
        runs[j] = starts[chosen[j]]
    runs[chosen.shape[0]] = starts[starts.shape[0] - 1]
    return runs


@njit(nogil=True, cache=True)
def moe_grouped(x, router, k, normalize, gu_p, gu_s, dn_p, dn_s, inter, threads, out):
    """Grouped q4 or q8 experts (qgroup.experts_grouped picks the kernel by weight type)."""
    idx, weights, starts, pairs, used = _plan(x, router, k, normalize)
    chosen = _chosen(starts, used)
    runs = _runs(starts, chosen)
    xs = _gather_all(x, pairs)
    gu = np.empty((xs.shape[0], 2 * inter), np.float32)
    experts_grouped(xs, gu_p, gu_s, chosen, runs, threads, gu)
    act = np.empty((xs.shape[0], inter), np.float32)
    silu_mul(gu, act)
    y = np.empty((xs.shape[0], out.shape[1]), np.float32)
    experts_grouped(act, dn_p, dn_s, chosen, runs, threads, y)
    ys = np.empty((x.shape[0], k, out.shape[1]), np.float32)
    _scatter(y, pairs, 0, pairs.shape[0], ys)
    combine(ys, weights, out)
    return idx, weights, used


@njit(nogil=True, cache=True)
def _expert_f32(x, pairs, starts, e, gw, dw, inter, ys):
    p0, p1 = starts[e], starts[e + 1]
    m = p1 - p0
    d = x.shape[1]
    xs = np.empty((m, d), np.float32)
    gu = np.empty((m, 2 * inter), np.float32)
    act = np.empty((m, inter), np.float32)
    y = np.empty((m, ys.shape[2]), np.float32)
    _gather(x, pairs, p0, p1, xs)
    matmul_f32(xs, gw[e], gu)
    silu_mul(gu, act)
    matmul_f32(act, dw[e], y)
    _scatter(y, pairs, p0, p1, ys)


@njit(nogil=True, cache=True)
def moe_f32(x, router, k, normalize, gu_w, dn_w, inter, threads, out):
    idx, weights, starts, pairs, used = _plan(x, router, k, normalize)
    ys = np.empty((x.shape[0], k, out.shape[1]), np.float32)
    for e in _chosen(starts, used):
        _expert_f32(x, pairs, starts, e, gu_w, dn_w, inter, ys)
    combine(ys, weights, out)
    return idx, weights, used


@njit(nogil=True, cache=True)
def _expert_q8r(x, pairs, starts, e, gp, gs, dp, ds, inter, ys):
    p0, p1 = starts[e], starts[e + 1]
    m = p1 - p0
    d = x.shape[1]
    xs = np.empty((m, d), np.float32)
    gu = np.empty((m, 2 * inter), np.float32)
    act = np.empty((m, inter), np.float32)
    y = np.empty((m, ys.shape[2]), np.float32)
    _gather(x, pairs, p0, p1, xs)
    matmul_q8(xs, gp[e], gs[e], gu)
    silu_mul(gu, act)
    matmul_q8(act, dp[e], ds[e], y)
    _scatter(y, pairs, p0, p1, ys)


@njit(nogil=True, cache=True)
def moe_q8r(x, router, k, normalize, gu_q, gu_s, dn_q, dn_s, inter, threads, out):
    idx, weights, starts, pairs, used = _plan(x, router, k, normalize)
    ys = np.empty((x.shape[0], k, out.shape[1]), np.float32)
    for e in _chosen(starts, used):
        _expert_q8r(x, pairs, starts, e, gu_q, gu_s, dn_q, dn_s, inter, ys)
    combine(ys, weights, out)
    return idx, weights, used


def route_reference(logits: np.ndarray, k: int, normalize: bool):
    """Naive twin of route in float64 (tests): (idx [N, k], weights [N, k])."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    idx = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, axis=1)
    if normalize:
        w = w / w.sum(axis=1, keepdims=True)
    return idx, w
