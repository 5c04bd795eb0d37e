"""Activation quantization for the integer-dot kernels: per block of 32 values of a row.

    xq[n, k] = rint(x[n, k] / dx[n, k // 32]),  dx = absmax of the block x level
    level: 1 / 32767 for an int16 xq (q8 weights), 1 / 127 for int8 (q4, q8a8)

So |xq| <= 32767 (int16) or <= 127 (int8; never -128, which the AVX2 dots rely on: a nibble
pair 2 x 15 x 127 and a signed q8a8 pair 2 x 128 x 127 fit int16). An all-zero block has
dx = 0 and xq = 0. No fastmath: the NumPy twin (reference.py) rounds the same.
"""

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from .irtools import BLOCK, F32, I32, array_ptr, call, load_vector, splat

INV_LEVEL16 = np.float32(1.0 / 32767.0)
INV_LEVEL8 = np.float32(1.0 / 127.0)


@intrinsic
def _quantize_block(typingctx, x, xi, xq, level):
    """Quantize the 32 floats at x.flat[xi:] into xq.flat[xi:] and return their scale d =
    absmax x level: rint(x * (1 / d)), 0 for an all-zero block. One vector of 32 (absmax as
    the unsigned max of the bits without sign: exact; rint and the conversion as vector
    instructions)."""
    if not (isinstance(x, types.Array) and isinstance(xq, types.Array)):
        return None
    width = xq.dtype.bitwidth

    def codegen(context, builder, signature, args):
        x_v, xi_v, xq_v, level_v = args
        vf = ir.VectorType(F32, BLOCK)
        vi = ir.VectorType(I32, BLOCK)
        v = load_vector(builder, array_ptr(context, builder, signature.args[0], x_v, xi_v), F32, 32)
        bits = builder.and_(builder.bitcast(v, vi), ir.Constant(vi, [0x7FFFFFFF] * BLOCK))
        top = call(builder, f"llvm.vector.reduce.umax.v{BLOCK}i32", I32, [bits])
        d = builder.fmul(builder.bitcast(top, F32), level_v)
        positive = builder.fcmp_ordered(">", d, ir.Constant(F32, 0.0))
        zero, one = ir.Constant(F32, 0.0), ir.Constant(F32, 1.0)
        inv = builder.select(positive, builder.fdiv(one, d), zero)
        scaled = builder.fmul(v, splat(builder, inv, vf))
        rounded = call(builder, f"llvm.rint.v{BLOCK}f32", vf, [scaled])
        q = builder.fptosi(rounded, ir.VectorType(ir.IntType(width), BLOCK))
        out = array_ptr(context, builder, signature.args[2], xq_v, xi_v)
        builder.store(q, builder.bitcast(out, q.type.as_pointer()), align=1)
        return d

    return types.float32(x, xi, xq, level), codegen


@njit(nogil=True, cache=True)
def quantize_activations(x, xq, dx):
    """xq[n, k] = rint(x[n, k] / dx[n, k // 32]), dx = absmax of the block / 32767 for an
    int16 xq, / 127 for int8. x and xq C-contiguous [N, K], K a multiple of 32."""
    n_rows, k_dim = x.shape
    if not (x.flags.c_contiguous and xq.flags.c_contiguous) or xq.shape != x.shape:
        raise ValueError("quantize_activations: x and xq must be C-contiguous [N, K]")
    if k_dim % BLOCK or dx.shape[0] != n_rows or dx.shape[1] != k_dim // BLOCK:
        raise ValueError("quantize_activations: K must be a multiple of 32, dx [N, K / 32]")
    level = INV_LEVEL16 if xq.itemsize == 2 else INV_LEVEL8
    for n in range(n_rows):
        for b in range(k_dim // BLOCK):
            dx[n, b] = _quantize_block(x, n * k_dim + b * BLOCK, xq, level)
