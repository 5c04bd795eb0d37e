"""exp that LLVM can vectorise, on any target.

Numba lowers np.exp to a scalar libm call per element, and softmax over a long context calls it
for every cached token of every head (about a million times per decoded token for a 2B model
at 2K context). This is the Cephes single-precision exp (about 1 ulp over the f32 range): a
polynomial plus an exponent built with integer ops, all plain LLVM IR, so the loops around it
become NEON or AVX code.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _pow2(typingctx, n):
    """2**n for an integral float32 n in [-126, 127], its exponent bits built in int32 (Numba's
    own int32 arithmetic widens to int64, which vectorised as 64-bit lanes and scatters)."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        biased = builder.add(builder.fptosi(args[0], i32), i32(127))
        return builder.bitcast(builder.shl(biased, i32(23)), ir.FloatType())

    return sig, codegen


LOG2E = np.float32(1.44269504088896341)
LN2_HI = np.float32(0.693359375)
LN2_LO = np.float32(-2.12194440e-4)


@njit(inline="always", fastmath={"nsz", "contract"}, cache=True)
def fast_exp(x):
    """exp(x) for float32 x, clamped to the normal f32 range (x in [-87.3, 88.7])."""
    x = min(max(x, np.float32(-87.33654)), np.float32(88.72283))
    n = np.floor(x * LOG2E + np.float32(0.5))
    r = x - n * LN2_HI - n * LN2_LO
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    y = p * r * r + r + np.float32(1.0)
    return y * _pow2(n)
