"""Wraps a tile loop listing (loop1.s or loop5.s, the loop body up to its jne) into
`run(groups, weights, scales, small)` for stream.c: per group of 64 blocks the loop's index
and counter restart, its weights pointer runs on through `weights`, its scales base moves
2 KB. The register roles are those LLVM gave the two listings stored beside this script
(a fresh listing may use other registers: its roles would have to be read off it).

    python wrap.py LOOP.s OUT.S 1|5
"""

import sys

body = open(sys.argv[1]).read().rstrip().splitlines()[:-1]  # the jne goes to .Linner
if sys.argv[3] == "1":
    weights, index, count, scales = "r14", "r15", "r11", "r12"
    small = {"r8": 0, "rdx": 65536, "rdi": 131072}  # corrections, activations, dx
    strides = {}
else:
    weights, index, count, scales = "r8", "r11", "rdi", "r15"
    small = {"rsi": 0, "rcx": 65536, "rdx": 196608}
    strides = {"rax": 64, "r9": 512, "r10": 2048}  # blocks a row, 2 rows of int32, K bytes
saved = ("rbx", "rbp", "r12", "r13", "r14", "r15")
out = ["\t.text", "\t.globl run", "run:"] + [f"\tpush %{r}" for r in saved]
out += [
    "\tsub $256, %rsp", "\tmovq %rdi, %rbx", "\tmovq %rsi, 8(%rsp)", "\tmovq %rcx, %rbp",
    "\tmovq %rdx, 24(%rsp)",
    "\tvpxord %zmm29, %zmm29, %zmm29", "\tvpxord %zmm30, %zmm30, %zmm30",
    "\tvpxord %zmm31, %zmm31, %zmm31",
    f"\tmovq 8(%rsp), %{weights}", f"\taddq $8384, %{weights}",  # loads are at -8384 ..
    ".Louter:",
]  # fmt: skip
out += [f"\tleaq {off}(%rbp), %{r}" for r, off in small.items()]
out += [f"\tmovq ${v}, %{r}" for r, v in strides.items()]
out += ["\tmovq $256, %r13", f"\txorq %{index}, %{index}", f"\tmovq $64, %{count}",
        f"\tmovq 24(%rsp), %{scales}", ".Linner:"] + body  # fmt: skip
out += ["\tjne .Linner", "\taddq $2048, 24(%rsp)", "\tdecq %rbx", "\tjne .Louter"]
out += ["\tadd $256, %rsp"]
out += [f"\tpop %{r}" for r in reversed(saved)] + ["\tret"]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
