"""Run by test_aarch64_ir.py in a subprocess with MERLIN_CPU_CLASS=arm64-dotprod|arm64-neon
and MERLIN_CPU_CLASS_IR_ONLY=1: builds the grouped kernels' block dots (qgroup's tile IR, the
code group_tile_block emits for a 4-row tile) and the fused vision attention's dot steps
(span_attention._dot_vectors: 4 vectors of GROUP lanes) into a plain LLVM module and
compiles it with LLVM's AArch64 target for CPU_NAME, printing the instruction counts as
JSON."""

import json
import re
import sys
from collections import Counter

from llvmlite import binding as llvm
from llvmlite import ir

from merlin.engine.kernels import qgroup, span_attention
from merlin.engine.kernels.irtools import I8, I32

cpu, features = sys.argv[1], sys.argv[2]
module = ir.Module(name="dots")
module.triple = "aarch64-unknown-linux-gnu"
counts = {}
for kind in ("q4", "q8a8", "q8"):
    rows = qgroup.TILE_ROWS
    out = ir.VectorType(I32, qgroup.GROUP)
    fnty = ir.FunctionType(
        ir.VoidType(), [I8.as_pointer(), I8.as_pointer(), I32, I32, out.as_pointer()]
    )
    fn = ir.Function(module, fnty, name=f"tile_{kind}")
    w, x, stride, corr, dst = fn.args
    builder = ir.IRBuilder(fn.append_basic_block())
    x_words = [
        builder.bitcast(builder.gep(x, [builder.mul(stride, I32(r))]), I32.as_pointer())
        for r in range(rows)
    ]
    if kind == "q8":
        ints = qgroup._q8_tile_ints(builder, w, x_words)
    else:
        tile = qgroup._q4_tile_ints if kind == "q4" else qgroup._q8a8_tile_ints
        ints = tile(builder, w, x_words, [corr] * rows)
    for r, v in enumerate(ints):
        builder.store(v, builder.gep(dst, [I32(r)]))
    builder.ret_void()

# the fused vision attention's score step (queries broadcast) and value step (weights broadcast)
for kind, word_is_w in (("span_scores", False), ("span_values", True)):
    fnty = ir.FunctionType(ir.VoidType(), [I32.as_pointer(), I8.as_pointer(), I32])
    fn = ir.Function(module, fnty, name=f"tile_{kind}")
    acc, base, word = fn.args
    builder = ir.IRBuilder(fn.append_basic_block())
    span_attention._dot_vectors(builder, acc, I32(0), base, word, 4, word_is_w)
    builder.ret_void()

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
machine = llvm.Target.from_triple(module.triple).create_target_machine(
    cpu=cpu, features=features, opt=3
)
parsed = llvm.parse_assembly(str(module))
parsed.verify()
passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
passes.getModulePassManager().run(parsed, passes)
asm = machine.emit_assembly(parsed)
for kind in ("q4", "q8a8", "q8", "span_scores", "span_values"):
    body = asm.split(f"tile_{kind}:")[1].split(".Lfunc_end")[0]
    counts[kind] = Counter(m.group(1) for m in re.finditer(r"^\s+([a-z][a-z0-9.]*)\s", body, re.M))
    counts[kind]["sdot by element"] = len(re.findall(r"^\s+sdot\s.*\.4b\[\d\]", body, re.M))
print(json.dumps({"class": qgroup.TARGET.name, "counts": counts}))
