"""Exact integer dot products per CPU class (kernels/target.py), as LLVM IR builders.

Every function here adds exact integer products into int32 lanes; whatever the instructions,
lane r ends with the same integer, so every class computes bit-identical kernel outputs and a
kernel's float operations (conversion, scale, fma) are the same on all of them.

Operands (n = the number of int32 lanes of `acc`):

    dot4(acc, w, xs)  lane r += sum_i w[4r + i] * xs[4r + i], w <4n x i8>, xs <4n x i8> signed
                      (an activation word broadcast). w is unsigned (0..255) where
                      SIGNED_QUADS is False (vpdpbusd, plain IR), signed where it is True
                      (sdot, the AVX2 and NEON forms of q8a8).
    dot2(acc, w, x)   lane r += w[2r] x[0] + w[2r + 1] x[1], w <2n x i8> (sign-extended
                      here), x an i32 holding two int16 (broadcast to every lane); on
                      aarch64 (SPLIT_PAIRS) w's even and odd bytes go apart to dot2_split.
    dot2_split(acc, a, b, x)   lane r += a[r] x[0] + b[r] x[1], a and b <n x i8>.
    Nibbles           a q4 block's 8 nibble products a row (NibbleSums): on VNNI, sdot and
                      generic a chain of dot4; on AVX2 vpmaddubsw (u8 x s8 -> adjacent pairs
                      in int16) summed in int16 and widened once by vpmaddwd with ones; on
                      NEON widening multiplies summed in int16, widened once.

Why int16 sums are exact: activations are int8 with |x| <= 127 (actquant.py), nibbles 0..15:
a vpmaddubsw pair is <= 2 x 15 x 127 = 3810 and a block's 8 of them <= 30480 < 32767
(vpmaddubsw saturates, so this bound is what keeps it exact). For q8a8 on AVX2 the weight is
split as |w| (vpabsb: -128 reads as unsigned 128) times sign(w) applied to x (vpsignb): a pair
<= 2 x 128 x 127 = 32512, widened after every slice. NEON: one product <= 128 x 127.
"""

from llvmlite import ir

from .irtools import I8, I16, I32, call, const_vec, pick, splat, vec
from .target import TARGET

DOT = TARGET.dot
SIGNED_QUADS = DOT in ("sdot", "avx2", "neon")
# int16 pair dots (dot2) as two multiply-adds by a broadcast int16 (aarch64's smlal), not as
# pair products gathered by shuffles (smull, uzp1/uzp2, add: llvm-mca, docs/kernels.md)
SPLIT_PAIRS = DOT in ("sdot", "neon")


def _join(builder, parts):
    """Concatenate equal vectors."""
    while len(parts) > 1:
        width = 2 * parts[0].type.count
        join = const_vec(I32, range(width))
        parts = [
            builder.shuffle_vector(parts[i], parts[i + 1], join) for i in range(0, len(parts), 2)
        ]
    return parts[0]


def _split(builder, v, parts: int):
    size = v.type.count // parts
    return [pick(builder, v, range(size * i, size * (i + 1))) for i in range(parts)]


def _by_halves(builder, fn, lanes_per_call, acc, *vs):
    """fn applied to 128- or 256-bit pieces (lanes_per_call int32 lanes of acc each)."""
    parts = acc.type.count // lanes_per_call
    if parts == 1:
        return fn(acc, *vs)
    pieces = zip(_split(builder, acc, parts), *(_split(builder, v, parts) for v in vs))
    return _join(builder, [fn(*p) for p in pieces])


def lane_sums(builder, prod, per: int, n: int):
    """<n x i32>: lane r = prod[per r] + ... + prod[per r + per - 1] (plain IR)."""
    total = None
    for i in range(per):
        part = pick(builder, prod, range(i, per * n, per))
        total = part if total is None else builder.add(total, part)
    return total


def vnni(builder, name, acc, a, b):
    """acc + the x86 VNNI dot `name` (vpdpbusd or vpdpwssd) on acc's lanes."""
    return call(builder, f"llvm.x86.avx512.{name}.{32 * acc.type.count}", acc.type, [acc, a, b])


def _sdot(builder, acc, w, xs):
    def one(a, x, y):
        return call(builder, "llvm.aarch64.neon.sdot.v4i32.v16i8", vec(I32, 4), [a, x, y])

    return _by_halves(builder, one, 4, acc, w, xs)


def pairs_to_i32(builder, p16):
    """<2m x i16> -> <m x i32>, adjacent pairs summed (vpmaddwd with ones on AVX2)."""
    m = p16.type.count // 2
    if DOT == "avx2":
        ones = const_vec(I16, [1] * 16)

        def one(p):
            return call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [p, ones])

        return _join(builder, [one(p) for p in _split(builder, p16, max(1, m // 8))])
    return lane_sums(builder, builder.sext(p16, vec(I32, 2 * m)), 2, m)


def maddubs(builder, u, s):
    """vpmaddubsw: <32k x i8> unsigned u times signed s -> <16k x i16> adjacent pairs summed
    (saturating: callers keep the sums in range)."""
    pieces = zip(_split(builder, u, u.type.count // 32), _split(builder, s, s.type.count // 32))
    name, out = "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16)
    return _join(builder, [call(builder, name, out, list(p)) for p in pieces])


def dot4(builder, acc, w, xs, w_below_128: bool = False):
    """acc + the 4-byte lane dots of w and xs (see the module docstring). w_below_128: every
    w byte is 0..127, valid as unsigned and as signed: AVX2 takes it as vpmaddubsw's unsigned
    operand directly (pairs <= 2 x 127 x 128), without the |w| and sign(w) steps."""
    n = acc.type.count
    if DOT == "vnni":
        return vnni(builder, "vpdpbusd", acc, w, xs)
    if DOT == "sdot":
        return _sdot(builder, acc, w, xs)
    if DOT == "avx2" and w_below_128:
        return builder.add(acc, pairs_to_i32(builder, maddubs(builder, w, xs)))
    if DOT == "avx2":  # signed w: |w| x (x with w's sign), pairs <= 2 x 128 x 127
        u = call(builder, f"llvm.abs.v{4 * n}i8", w.type, [w, ir.Constant(ir.IntType(1), 0)])
        s = _by_halves_bytes(builder, "llvm.x86.avx2.psign.b", xs, w)
        return builder.add(acc, pairs_to_i32(builder, maddubs(builder, u, s)))
    wide = vec(I32, 4 * n)
    w32 = builder.sext(w, wide) if SIGNED_QUADS else builder.zext(w, wide)
    return builder.add(acc, lane_sums(builder, builder.mul(w32, builder.sext(xs, wide)), 4, n))


def _by_halves_bytes(builder, name, a, b):
    pieces = zip(_split(builder, a, a.type.count // 32), _split(builder, b, b.type.count // 32))
    return _join(builder, [call(builder, name, vec(I8, 32), list(p)) for p in pieces])


def dot2(builder, acc, w, xword):
    """acc + w[2r] x0 + w[2r + 1] x1 per lane r: w <2n x i8> int8 weights (sign-extended here),
    xword an i32 of two int16 broadcast to every lane."""
    n = acc.type.count
    if SPLIT_PAIRS:
        evens, odds = (pick(builder, w, range(i, 2 * n, 2)) for i in (0, 1))
        return dot2_split(builder, acc, evens, odds, xword)
    v16 = vec(I16, 2 * n)
    w16 = builder.sext(w, v16)
    xs = builder.bitcast(splat(builder, xword, vec(I32, n)), v16)
    if DOT == "vnni":
        return vnni(builder, "vpdpwssd", acc, w16, xs)
    if DOT == "avx2" and n % 8 == 0:

        def one(a, p, q):
            return builder.add(a, call(builder, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [p, q]))

        return _by_halves(builder, one, 8, acc, w16, xs)
    pairs = vec(I32, 2 * n)
    prod = builder.mul(builder.sext(w16, pairs), builder.sext(xs, pairs))
    return builder.add(acc, lane_sums(builder, prod, 2, n))


def dot2_split(builder, acc, a, b, xword):
    """acc + a[r] x0 + b[r] x1 per lane r: dot2 with the pairs' two int8 vectors apart (<n x
    i8> each), for the SPLIT_PAIRS classes: two widening multiply-adds by a broadcast int16,
    which aarch64 emits as smlal/smlal2 (int16 x int16 into int32 lanes: no pair sums to
    gather, and a, b need no interleaving). The x86 classes interleave into dot2's pairs."""
    assert SPLIT_PAIRS, "x86's pair dots take the pairs interleaved (dot2)"
    n = acc.type.count
    v16, v32 = vec(I16, n), vec(I32, n)
    for half, v in ((xword, a), (builder.lshr(xword, I32(16)), b)):  # x0: the low half
        x = splat(builder, builder.trunc(half, I16), v16)
        prod = builder.mul(builder.sext(builder.sext(v, v16), v32), builder.sext(x, v32))
        acc = builder.add(acc, prod)
    return acc


class NibbleSums:
    """The int32 block dot of a group's rows with one activation row, over a q4 block's 8
    nibble vectors (low and high nibbles of 4 slices), in `chains` independent partial sums:
    start from corr (the nibbles' +8 taken out), add(nibbles, xs) up to 8 times, total()."""

    def __init__(self, builder, corr, n: int, chains: int):
        self.b, self.n, self.count = builder, n, 0
        self.corr = splat(builder, corr, vec(I32, n))
        if DOT in ("avx2", "neon"):  # int16 sums, widened once in total()
            width = 2 * n if DOT == "avx2" else 4 * n
            zero = ir.Constant(vec(I16, width), [0] * width)
            self.sums = [zero] * chains
        else:
            self.sums = [self.corr] + [ir.Constant(vec(I32, n), [0] * n)] * (chains - 1)

    def add(self, nibbles, xs):
        b, c = self.b, self.count % len(self.sums)
        self.count += 1
        assert self.count <= 8, "int16 sums are exact for one block's 8 nibble vectors"
        if DOT == "avx2":
            self.sums[c] = b.add(self.sums[c], maddubs(b, nibbles, xs))
        elif DOT == "neon":
            wide = vec(I16, 4 * self.n)
            prod = b.mul(b.zext(nibbles, wide), b.sext(xs, wide))
            self.sums[c] = b.add(self.sums[c], prod)
        else:  # vnni, sdot, generic: nibbles 0..15 are valid as unsigned and as signed bytes
            self.sums[c] = dot4(b, self.sums[c], nibbles, xs)

    def total(self):
        b = self.b
        total = self.sums[0]
        for s in self.sums[1:]:
            total = b.add(total, s)
        if DOT == "avx2":
            return b.add(pairs_to_i32(b, total), self.corr)
        if DOT == "neon":
            four = lane_sums(b, b.sext(total, vec(I32, 4 * self.n)), 4, self.n)
            return b.add(four, self.corr)
        return total
