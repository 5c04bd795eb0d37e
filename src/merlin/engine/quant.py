"""Block-quantized weight formats: q8_0 and q4_0, one scale per 32 consecutive weights of a row.

A weight matrix w [O, K] (O output rows, K inputs, K a multiple of 32) is stored as two
C-contiguous arrays, row-major like the f32 weight:

    fmt   qs                         scales                 bytes / weight
    q8    int8  [O, K]               uint16 [O, K // 32]    1 + 2/32 = 1.0625
    q4    uint8 [O, K // 2]          uint16 [O, K // 32]    0.5 + 2/32 = 0.5625

    q8: w[o, k] ~ qs[o, k] * s[o, k // 32], qs in -127..127, s = absmax / 127 of the block.
    q4: w[o, k] ~ q * s, q in -8..7 stored as the nibble q + 8. The 16 bytes of block b are
        bytes 16b..16b+15 of the row; byte j holds weight 32b + j in its low nibble and weight
        32b + 16 + j in its high nibble (llama.cpp's q4_0 order), so one 16-byte load gives two
        16-lane halves with an `and` and a shift. s = m / -8 where m is the block's value of
        largest magnitude (with its sign): m maps to -8 exactly, the other side reaches +7
        (llama.cpp's choice; 8 steps instead of 7 for the same range).

Scales are bfloat16 bits (the upper half of a float32), rounded up in magnitude so that no
weight is clipped by the rounding: q8 error <= s/2 per weight, q4 error <= s/2 except for the
top of the range opposite to m, where it is <= |s|. bf16 keeps float32's exponent range (f16
scales underflow for blocks of tiny weights, which occur in real checkpoints) and decodes with
one shift, vectorisable on x86 and NEON alike; it costs 8 mantissa bits, i.e. at most a 0.4%
larger step, far below the quantization error itself.

Why this layout (dev boxes: 2-core AMD EPYC Zen 4 and Intel Ice Lake, AVX-512; figures from
`python -m merlin.engine.bench kernels`, see the kernels' docstring):
  - separate, contiguous qs and scales arrays instead of llama.cpp's interleaved 34- or 18-byte
    blocks: every weight load is a whole block at a fixed stride, the kernels need no byte
    shuffling, and the scale stream (1/17 of the q8 bytes, 1/9 of q4) streams alongside.
  - row-major here, the form every consumer starts from (prefill tiles, embedding rows,
    error statistics). For decode both formats are regrouped at load into blocks of 16 (x86
    with AVX512-VNNI) or 8 interleaved rows (engine/kernels/qgroup.py), so that one integer
    dot-product instruction serves all rows of a group and the conversion and scaling are
    shared: q4 2-2.5x faster than a row-major kernel; q8 grouped on the x86 classes
    (aarch64 and the generic class row-major, engine/kernels/qlinear.py).
  - bf16 (uint16) scales, not f32: the same kernels accept float32 scale arrays, and decode
    speed did not differ measurably, so the 2 bytes per block are saved (q4: 0.5625 instead of
    0.625 bytes per weight, 10% fewer bytes per token).

Quantization is vectorised NumPy over chunks of rows (peak extra memory a few times the chunk,
not the tensor), so a checkpoint can be quantized tensor by tensor while it loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32
FORMATS = ("q8", "q4")
_CHUNK_WEIGHTS = 1 << 18  # weights per quantization chunk: f32 temporaries stay in cache


def bytes_per_weight(fmt: str) -> float:
    if fmt == "q8":
        return 1.0 + 2.0 / BLOCK
    if fmt == "q4":
        return 0.5 + 2.0 / BLOCK
    if fmt == "f32":
        return 4.0
    raise ValueError(f"unknown weight format {fmt!r}: use one of f32, q8, q4")


@dataclass(frozen=True, eq=False)
class QTensor:
    """A block-quantized weight matrix [O, K]; see the module docstring for the layout."""

    fmt: str  # "q8" | "q4"
    qs: np.ndarray  # q8: int8 [O, K]; q4: uint8 [O, K // 2]
    scales: np.ndarray  # uint16 [O, K // 32] (bf16 bits); float32 also accepted by kernels

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * BLOCK

    @property
    def out_features(self) -> int:
        return self.scales.shape[0]

    @property
    def in_features(self) -> int:
        return self.scales.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.scales.nbytes

    @property
    def bytes_per_weight(self) -> float:
        return self.nbytes / (self.shape[0] * self.shape[1])


# --------------------------------------------------------------------------- bf16 scales


def bf16_round_up(s: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounded away from zero so |bf16| >= |s|."""
    bits = np.ascontiguousarray(s, dtype=np.float32).view(np.uint32)
    sign = bits & np.uint32(0x80000000)
    mag = bits & np.uint32(0x7FFFFFFF)
    up = (mag + np.uint32(0xFFFF)) >> np.uint32(16)  # ceil of the magnitude in bf16
    return (up | (sign >> np.uint32(16))).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def scales_f32(qt: QTensor) -> np.ndarray:
    """The block scales as float32 [O, K // 32]."""
    if qt.scales.dtype == np.float32:
        return qt.scales
    return bf16_to_f32(qt.scales)


# --------------------------------------------------------------------------- quantize


def _check(w: np.ndarray) -> tuple[int, int]:
    if w.ndim != 2:
        raise ValueError(f"can only quantize a 2-D weight matrix, got shape {w.shape}")
    o, k = w.shape
    if k % BLOCK:
        raise ValueError(
            f"cannot block-quantize a weight with {k} inputs: not a multiple of {BLOCK} "
            "(keep this tensor in f32)"
        )
    return o, k


def _rows_per_chunk(k: int) -> int:
    return max(1, _CHUNK_WEIGHTS // max(k, 1))


def _blocks(w: np.ndarray, r0: int, r1: int):
    """Rows r0..r1 as float32 blocks [R, K // 32, 32] (converting bf16/f16 chunk by chunk),
    with the per-block max and min."""
    wb = np.asarray(w[r0:r1], dtype=np.float32).reshape(r1 - r0, -1, BLOCK)
    hi, lo = wb.max(axis=2), wb.min(axis=2)  # nan and inf propagate into these
    if not (np.isfinite(hi).all() and np.isfinite(lo).all()):
        raise ValueError(f"weight rows {r0}..{r1 - 1} contain inf or nan; cannot quantize")
    return wb, hi, lo


def _scaled(wb: np.ndarray, s: np.ndarray) -> np.ndarray:
    """rint(wb / s) per block as float32 (0 where s == 0)."""
    inv = np.divide(np.float32(1.0), s, out=np.zeros_like(s), where=s != 0)
    q = np.multiply(wb, inv[:, :, None])
    return np.rint(q, out=q)


def quantize_q8(w: np.ndarray) -> QTensor:
    """w [O, K] (any float dtype, K % 32 == 0) -> q8 QTensor."""
    o, k = _check(w)
    qs = np.empty((o, k), np.int8)
    scales = np.empty((o, k // BLOCK), np.uint16)
    step = _rows_per_chunk(k)
    for r0 in range(0, o, step):
        r1 = min(o, r0 + step)
        wb, hi, lo = _blocks(w, r0, r1)
        bits = bf16_round_up(np.maximum(hi, -lo) / np.float32(127.0))
        # s >= absmax / 127, so |w / s| <= 127 up to rounding: no clipping needed
        qs[r0:r1] = _scaled(wb, bf16_to_f32(bits)).reshape(r1 - r0, k)
        scales[r0:r1] = bits
    return QTensor("q8", qs, scales)


def quantize_q4(w: np.ndarray) -> QTensor:
    """w [O, K] (any float dtype, K % 32 == 0) -> q4 QTensor."""
    o, k = _check(w)
    qs = np.empty((o, k // 2), np.uint8)
    scales = np.empty((o, k // BLOCK), np.uint16)
    step = _rows_per_chunk(k)
    for r0 in range(0, o, step):
        r1 = min(o, r0 + step)
        wb, hi, lo = _blocks(w, r0, r1)
        m = np.where(-lo > hi, lo, hi)  # the value of largest magnitude, with its sign
        bits = bf16_round_up(m / np.float32(-8.0))
        q = _scaled(wb, bf16_to_f32(bits))  # in -8..8: m -> -8, the other side up to +8
        np.minimum(q, 7.0, out=q)
        q += 8.0
        u = q.astype(np.uint8)  # [R, nb, 32] in 0..15
        packed = u[:, :, :16] | (u[:, :, 16:] << np.uint8(4))
        qs[r0:r1] = packed.reshape(r1 - r0, k // 2)
        scales[r0:r1] = bits
    return QTensor("q4", qs, scales)


def quantize(w: np.ndarray, fmt: str) -> QTensor:
    if fmt == "q8":
        return quantize_q8(w)
    if fmt == "q4":
        return quantize_q4(w)
    raise ValueError(f"unknown quantized format {fmt!r}: use one of {', '.join(FORMATS)}")


# --------------------------------------------------------------------------- dequantize


def unpack_q4(qs: np.ndarray) -> np.ndarray:
    """q4 bytes [O, K // 2] -> signed values int8 [O, K] in -8..7."""
    o = qs.shape[0]
    b = qs.reshape(o, -1, 16)
    u = np.concatenate([b & np.uint8(15), b >> np.uint8(4)], axis=2)
    return (u.astype(np.int8) - np.int8(8)).reshape(o, -1)


def dequantize(qt: QTensor, rows: slice | None = None) -> np.ndarray:
    """The f32 weight [O, K] (or the given row slice) the kernels compute with."""
    rows = rows if rows is not None else slice(None)
    qs, s = qt.qs[rows], scales_f32(qt)[rows]
    q = qs if qt.fmt == "q8" else unpack_q4(qs)
    o = q.shape[0]
    w = q.reshape(o, -1, BLOCK).astype(np.float32) * s[:, :, None]
    return w.reshape(o, -1)


def error_stats(w: np.ndarray, qt: QTensor) -> dict:
    """How far the quantized weight is from w: absolute, relative and per-block figures."""
    w = np.asarray(w, dtype=np.float32)
    d = dequantize(qt)
    err = (d - w).astype(np.float64)
    w64 = w.astype(np.float64)
    rms_w = float(np.sqrt(np.mean(w64 * w64)))
    rms_e = float(np.sqrt(np.mean(err * err)))
    s = np.abs(scales_f32(qt)).astype(np.float64)
    blk_err = np.abs(err).reshape(w.shape[0], -1, BLOCK).max(axis=2)
    ratio = np.divide(blk_err, s, out=np.zeros_like(blk_err), where=s > 0)
    return {
        "fmt": qt.fmt,
        "max_abs_err": float(np.abs(err).max()) if err.size else 0.0,
        "rms_err": rms_e,
        "rel_rms_err": rms_e / rms_w if rms_w > 0 else 0.0,
        "max_err_over_scale": float(ratio.max()) if ratio.size else 0.0,
        "snr_db": float(20 * np.log10(rms_w / rms_e)) if rms_e > 0 else float("inf"),
        "bytes_per_weight": qt.bytes_per_weight,
    }
