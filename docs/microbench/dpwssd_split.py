"""Which LLVM splits a chain of vpdpwssd into vpmaddwd + vpaddd, and whether the fast-dpwssd
tuning (kernels/target.py FUSED_DPWSSD) keeps it whole (docs/kernels.md, "vpdpwssd kept
whole"). Uses llvmlite alone, so it runs in a throwaway venv with any llvmlite version:

    python3 -m venv /tmp/llv && /tmp/llv/bin/pip install llvmlite==0.45.1
    /tmp/llv/bin/python docs/microbench/dpwssd_split.py

The loop is the shape of the grouped q8 tiles: ROWS accumulators, each taking DOTS chained
vpdpwssd an iteration against one weight vector and a broadcast activation word. Prints, per
CPU model LLVM knows, the vpdpwssd and vpmaddwd in the listing with the plain AVX-512 VNNI
features and with the tuning added (LLVM prints its own warning when it does not know it).
"""

import llvmlite.binding as ll

ROWS, DOTS = 2, 4
CPUS = ("emeraldrapids", "sapphirerapids", "icelake-server", "znver4")
FEATURES = "+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni"
V = "<16 x i32>"


def loop_ir(opaque_pointers: bool) -> str:
    vp, ip = ("ptr", "ptr") if opaque_pointers else (f"{V}*", "i32*")
    lines = [
        f"declare {V} @llvm.x86.avx512.vpdpwssd.512({V}, {V}, {V})",
        f"define void @tile({vp} %w, {ip} %x, {vp} %out, i64 %n) {{",
        "entry:",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%next, %loop]",
    ]
    for r in range(ROWS):
        lines.append(f"  %a{r}_0 = phi {V} [zeroinitializer, %entry], [%a{r}_{DOTS}, %loop]")
    for d in range(DOTS):
        lines += [
            f"  %wi{d} = add i64 %i, {d * 1000}",
            f"  %wp{d} = getelementptr {V}, {vp} %w, i64 %wi{d}",
            f"  %w{d} = load {V}, {vp} %wp{d}",
        ]
        for r in range(ROWS):
            lines += [
                f"  %xi{r}_{d} = add i64 %i, {r * 100 + d * 10}",
                f"  %xp{r}_{d} = getelementptr i32, {ip} %x, i64 %xi{r}_{d}",
                f"  %x{r}_{d} = load i32, {ip} %xp{r}_{d}",
                f"  %v{r}_{d} = insertelement {V} undef, i32 %x{r}_{d}, i32 0",
                f"  %s{r}_{d} = shufflevector {V} %v{r}_{d}, {V} undef, {V} zeroinitializer",
                f"  %a{r}_{d + 1} = call {V} @llvm.x86.avx512.vpdpwssd.512({V} %a{r}_{d}, "
                f"{V} %w{d}, {V} %s{r}_{d})",
            ]
    lines += [
        "  %next = add i64 %i, 1",
        "  %more = icmp slt i64 %next, %n",
        "  br i1 %more, label %loop, label %exit",
        "exit:",
    ]
    for r in range(ROWS):
        lines += [
            f"  %o{r} = getelementptr {V}, {vp} %out, i64 {r}",
            f"  store {V} %a{r}_{DOTS}, {vp} %o{r}",
        ]
    return "\n".join(lines + ["  ret void", "}"]) + "\n"


def main() -> None:
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    version = ll.llvm_version_info
    module = ll.parse_assembly(loop_ir(opaque_pointers=version >= (17,)))
    target = ll.Target.from_triple("x86_64-unknown-linux-gnu")
    cpus = [c for c in CPUS if version >= (17,) or c in ("icelake-server",)]  # LLVM 14-15
    for cpu in cpus:
        for label, features in (("plain", FEATURES), ("+fast-dpwssd", FEATURES + ",+fast-dpwssd")):
            machine = target.create_target_machine(cpu=cpu, features=features, opt=3)
            asm = machine.emit_assembly(module)
            print(
                f"LLVM {'.'.join(map(str, version))} {cpu:<15} {label:<13} "
                f"vpdpwssd {asm.count('vpdpwssd')}  vpmaddwd {asm.count('vpmaddwd')}"
            )


if __name__ == "__main__":
    main()
