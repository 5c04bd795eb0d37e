"""LLVM IR pieces the kernels share: stack scratch, prefetch, bf16 scale decode, vector loads.

Numba intrinsics (usable from @njit code) and plain builder helpers (for other intrinsics).
Nothing here depends on the CPU class; the dot instructions per class are in dots.py.

Invariants: the stack scratch is an entry-block alloca (LLVM promotes it to registers; a heap
array would be hoisted by Numba out of a prange loop and shared by a thread's tasks);
prefetch never faults, also past the end of an array; scale_to_f32 is exact (bf16 bits are the
top half of a float32).
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import FASTMATH

BLOCK = 32  # weights per quantization block (engine/quant.py)
# The quantized kernels keep an explicit summation order (lane accumulators, fixed trees):
# reassociation would let LLVM regroup products differently in different register tiles and
# break the bitwise independence of a row from N and the thread count.
QFASTMATH = FASTMATH - {"reassoc"}

I8, I16, I32, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()


def vec(elem, count: int) -> ir.VectorType:
    return ir.VectorType(elem, count)


def const_vec(elem, values) -> ir.Constant:
    values = list(values)
    return ir.Constant(ir.VectorType(elem, len(values)), values)


def splat(builder, value, vtype: ir.VectorType):
    """`value` in every lane of a vector of type vtype (a broadcast)."""
    first = builder.insert_element(ir.Constant(vtype, None), value, I32(0))
    return builder.shuffle_vector(first, first, ir.Constant(ir.VectorType(I32, vtype.count), None))


def array_ptr(context, builder, aty, arr, idx):
    """Pointer to arr.flat[idx] (arr of Numba type aty)."""
    return builder.gep(context.make_array(aty)(context, builder, arr).data, [idx])


def load_vector(builder, ptr, elem, count: int, align: int = 1):
    """`count` elements of type elem from ptr (unaligned unless told)."""
    return builder.load(builder.bitcast(ptr, vec(elem, count).as_pointer()), align=align)


def pick(builder, v, indices):
    """The elements of v at `indices` (a shuffle)."""
    return builder.shuffle_vector(v, v, const_vec(I32, indices))


def call(builder, name: str, ret, args):
    """A call of the LLVM intrinsic `name` returning `ret`."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ret, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def opaque(builder, value):
    """value through an empty inline asm (no instruction is emitted): LLVM can no longer see
    how it was computed. A tile's row pointers (base + row x stride) go through it so that
    each is a register of its own and its loads address register + displacement; left
    visible, loop strength reduction shares one index register among the rows, and on Intel
    a dot with a base + index memory operand is un-laminated into two uops (docs/kernels.md,
    "The verify tile against DRAM")."""
    return builder.asm(ir.FunctionType(value.type, [value.type]), "", "=r,0", [value], False)


def emit_prefetch(builder, ptr, locality: int = 3):
    """llvm.prefetch of ptr for reading (prefetcht0 / prfm pldl1keep at locality 3, into L2 at
    2). Never faults."""
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    builder.call(fn, [ptr, I32(0), I32(locality), I32(1)])


def _stack_scratch(n, llvm_type, numba_type):
    if not isinstance(n, types.IntegerLiteral):
        return None
    size = n.literal_value

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.ArrayType(llvm_type, size))
        slot.align = 64
        return builder.bitcast(slot, ir.PointerType(llvm_type))

    return types.CPointer(numba_type)(n), codegen


@intrinsic
def stack_f32(typingctx, n):
    """A float32 scratch of literal size n on the stack (entry-block alloca): LLVM promotes it
    to registers."""
    return _stack_scratch(n, F32, types.float32)


@intrinsic
def stack_i32(typingctx, n):
    """The int32 twin of stack_f32 (integer accumulators)."""
    return _stack_scratch(n, I32, types.int32)


@intrinsic
def stack_i8(typingctx, n):
    """The int8 twin of stack_f32 (bytes an integer dot reads as broadcast words)."""
    return _stack_scratch(n, I8, types.int8)


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint to bring the cache line of arr.flat[idx] into L1. Never faults."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        emit_prefetch(builder, array_ptr(context, builder, signature.args[0], args[0], args[1]))
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@intrinsic
def scale_to_f32(typingctx, v):
    """A block scale as float32: uint16 holds bfloat16 bits (a shift and a bit cast,
    vectorisable everywhere); float32 passes through."""
    if isinstance(v, types.Float) and v.bitwidth == 32:

        def identity(context, builder, signature, args):
            return args[0]

        return types.float32(v), identity
    if not (isinstance(v, types.Integer) and v.bitwidth == 16):
        return None

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], I32)
        return builder.bitcast(builder.shl(wide, I32(16)), F32)

    return types.float32(v), codegen


def bf16_vector_to_f32(builder, bits):
    """<n x i16> bf16 bits -> <n x float>, exact."""
    n = bits.type.count
    wide = builder.shl(builder.zext(bits, vec(I32, n)), const_vec(I32, [16] * n))
    return builder.bitcast(wide, vec(F32, n))
