"""The board section's machinery (bench/board.py, cross.py, loops.py, mca.py): a kernel compiled
for a CPU that is not here, its loop found in the assembly, llvm-mca's cycles for it, and the
per-token arithmetic of the projection. llvm-mca comes from Debian's llvm package
(scripts/system-deps.sh installs it); without it these tests fail with the install hint."""

import math
import os
from functools import partial

import numpy as np
import pytest

from merlin.engine.bench import board, loops, mca
from merlin.engine.bench.cross import compile_asm


@pytest.fixture(scope="module")
def tool():
    path = mca.find_llvm_mca()
    if path is None:
        pytest.fail(mca.INSTALL_HINT + " (scripts/system-deps.sh does it)")
    return path


def _chain_cycles(asm: str, triple: str, mcpu: str, tool: str) -> float:
    """llvm-mca's cycles a step of clock.chain: its main loop over its xors."""
    steps, loop = max((lp.count("xorq", "eor"), lp) for lp in loops.find_loops(asm))
    return mca.cycles_per_iteration(loop.text(), triple, mcpu, tool) / steps


def test_clock_chain_cross_compiled_for_cortex_a76_and_for_this_host(tool):
    """The add/xor chain is two dependent one-cycle operations a step (board.CHAIN_CYCLES) on
    the cores whose tables llvm-mca has right."""
    arm = compile_asm(board.AARCH64, "cortex-a76", board.A76_FEATURES, kernels=("clock",))
    assert arm["group"] == 8 and arm["dot"] == "sdot"  # the kernels saw an A76 with dotprod
    assert "eor" in arm["asm"]["clock"] and "xorq" not in arm["asm"]["clock"]
    chain = partial(_chain_cycles, arm["asm"]["clock"], "aarch64", tool=tool)
    assert chain("neoverse-n1") == pytest.approx(board.CHAIN_CYCLES, rel=0.2)
    assert chain("cortex-a55") >= 1.5
    host = compile_asm(None, "x86-64-v3", None, kernels=("clock",))
    assert "xorq" in host["asm"]["clock"]
    assert _chain_cycles(host["asm"]["clock"], "x86_64", "x86-64-v3", tool) == pytest.approx(
        board.CHAIN_CYCLES, rel=0.2
    )


def test_the_newest_llvm_mca_is_used_and_says_whose_tables_a_core_gets(tmp_path, monkeypatch):
    """LLVM 14-16 schedule neoverse-n1 (the A76) on the Cortex-A57's tables; LLVM 19 has the
    N1's own. The newest llvm-mca found wins over the one on PATH."""
    for version, folder in ((14, "bin"), (19, "llvm-19/bin")):
        (tmp_path / folder).mkdir(parents=True)
        fake = tmp_path / folder / "llvm-mca"
        fake.write_text(f"#!/bin/sh\necho 'Debian LLVM version {version}.0.1'\n")
        fake.chmod(0o755)
    monkeypatch.delenv("MERLIN_LLVM_MCA", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(mca, "VERSIONED", str(tmp_path / "llvm-*/bin/llvm-mca"))
    assert mca.find_llvm_mca() == str(tmp_path / "llvm-19/bin/llvm-mca")
    assert mca.llvm_version(str(tmp_path / "bin/llvm-mca")) == 14


def test_scheduling_model_names_the_tables_llvm_mca_uses(tool):
    if mca.llvm_version(tool) >= 19:
        assert mca.has_own_model(tool, "aarch64", "neoverse-n1")
    assert mca.scheduling_model(tool, "aarch64", "cortex-a55").startswith("CortexA55")
    assert mca.has_own_model(tool, "aarch64", "cortex-a55") is None  # not in the table
    old = "/usr/lib/llvm-14/bin/llvm-mca"
    if os.access(old, os.X_OK):
        assert mca.scheduling_model(old, "aarch64", "neoverse-n1").startswith("A57")
        assert mca.has_own_model(old, "aarch64", "neoverse-n1") is False


def test_mca_counts_a_dependency_chain(tool):
    chain = "add\tx0, x0, x1\nadd\tx0, x0, x1\nadd\tx0, x0, x1\nadd\tx0, x0, x1\n"
    assert mca.cycles_per_iteration(chain, "aarch64", "neoverse-n1", tool) == pytest.approx(4, 0.1)
    independent = "add\tx2, x0, x1\nadd\tx3, x0, x1\nadd\tx4, x0, x1\nadd\tx5, x0, x1\n"
    assert mca.cycles_per_iteration(independent, "aarch64", "neoverse-n1", tool) < 3


def test_missing_llvm_mca_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MERLIN_LLVM_MCA", "")
    with pytest.raises(mca.McaMissing, match="apt-get install llvm"):
        mca.require_llvm_mca()


ASM = """
	.text
f:
	mov	x8, xzr
.LBB0_2:                                // =>This Inner Loop Header: Depth=1
	ldr	q0, [x1, x8]
	sdot	v1.4s, v0.16b, v2.16b
	sdot	v3.4s, v0.16b, v4.16b
	scvtf	v5.4s, v1.4s
	scvtf	v6.4s, v3.4s
	smlal	v7.4s, v8.4h, v9.4h
	smlal2	v7.4s, v8.8h, v9.8h
	add	x8, x8, #16
	cmp	x8, x9
	b.ne	.LBB0_2
// %bb.3:
	ret
.LBB0_4:
	ldr	q0, [x1]
	b	.LBB0_4
"""


def test_loops_found_and_described():
    found = loops.find_loops(ASM)
    assert [lp.label for lp in found] == [".LBB0_2"]  # an unconditional self-branch is no loop
    loop = found[0]
    assert loop.mnemonics[0] == "ldr" and loop.mnemonics[-1] == "b.ne"
    assert "#16" in loop.text()  # an AArch64 immediate is not a comment
    assert loop.converts == 8 and loop.products == 2 * 4 * 4 + 4 + 4  # smlal2: 4 products
    assert loops.tile_loops(ASM, 8) == {1: loop} and loops.tile_loops(ASM, 4) == {2: loop}


ARM_PASS = """
.LBB3_34:
	ldr	q20, [x10]
	fsub	v20.4s, v20.4s, v1.4s
	str	q20, [x10], #16
	subs	x9, x9, #4
	b.ne	.LBB3_34
.LBB3_41:
	ldp	q2, q3, [x10, #-16]
	ldr	q4, [x8, :lo12:.LCPI3_0]
	fadd	v0.4s, v2.4s, v0.4s
	fadd	v1.4s, v3.4s, v1.4s
	add	x10, x10, #32
	subs	x11, x11, #8
	b.ne	.LBB3_41
.LBB3_45:
	ldr	s1, [x10], #4
	fadd	s0, s1, s0
	adds	x9, x9, #1
	b.lo	.LBB3_45
"""
X86_PASS = """
.LBB0_7:
	vmulps	(%rsi,%rax,4), %ymm12, %ymm13
	vmulps	32(%rsi,%rax,4), %ymm12, %ymm14
	vbroadcastss	.LCPI0_1(%rip), %ymm3
	vmulps	(%rdx,%rax,4), %ymm14, %ymm14
	vcvtps2dq	%ymm13, %ymm13
	vpmovdw	%ymm13, -48(%r14,%rax,2)
	leaq	(%rbx,%rax,2), %rcx
	vscatterqps	%ymm6, (,%zmm11) {%k1}
	addq	$16, %rax
	cmpq	%rax, %rdi
	jne	.LBB0_7
.LBB0_11:
	vmulss	(%rsi,%rax,4), %xmm11, %xmm0
	vcvtss2si	%xmm0, %ebp
	movw	%bp, (%rcx,%rax,2)
	incq	%rax
	decq	%rdi
	jne	.LBB0_11
"""


def test_a_pass_loop_counts_the_keys_it_loads_through_one_address():
    """Loop.elements: 32-bit lanes loaded an iteration through its busiest address, stores,
    address arithmetic, scatters and literal-pool constants left out; stream_loop takes the
    pass's vector body over its remainders."""
    arm = {lp.label: lp.elements for lp in loops.find_loops(ARM_PASS)}
    assert arm == {".LBB3_34": 4, ".LBB3_41": 8, ".LBB3_45": 1}
    assert loops.stream_loop(ARM_PASS).label == ".LBB3_41"
    x86 = {lp.label: lp.elements for lp in loops.find_loops(X86_PASS)}
    assert x86 == {".LBB0_7": 16, ".LBB0_11": 1}  # two ymm through (%rsi,%rax,4)
    assert loops.stream_loop(X86_PASS).label == ".LBB0_7"
    # AVX-VNNI's dots print with an encoding prefix; a packed dot is not a scalar "sd"
    vex = loops.Loop(
        ".L", ["{vex}\tvpdpwssd\t(%rax,%rcx), %ymm1, %ymm2", "vcvtdq2ps\t%ymm2, %ymm4"]
    )
    assert vex.mnemonics == ["vpdpwssd", "vcvtdq2ps"]
    assert (vex.products, vex.converts, vex.elements) == (16, 8, 8)
    # an AVX-512 masked store is a store, not a load
    masked = loops.Loop(".L", ["vmovups\t%zmm0, (%rdi,%rax,4) {%k1}", "vmovups\t(%rsi), %ymm1"])
    assert masked.elements == 8
    with pytest.raises(ValueError, match="no loop"):
        loops.stream_loop(".L1:\n\tadd\tx0, x0, #1\n\tb.ne\t.L1\n")


def test_the_passes_compiled_for_the_a76_are_modelled_a_key_each(tool):
    """Every pass of attention.ROW_PASSES is cross-compiled on its own and gets cycles a key
    from its main loop; the vector exp costs more a key than the scale or the sum, and the
    model of a query and key is its products plus every pass (the max twice)."""
    from merlin.engine.bench.cross import ROW_PASS_KERNELS
    from merlin.engine.kernels.attention import ROW_PASSES

    assert [f"pass{name}" for name in dict.fromkeys(ROW_PASSES)] == list(ROW_PASS_KERNELS)
    asm = compile_asm(board.AARCH64, "cortex-a76", board.A76_FEATURES, kernels=ROW_PASS_KERNELS)
    model = board.analyse(asm, "neoverse-n1", board.AARCH64, tool)
    passes = model["pass_cycles_per_key"]
    assert set(passes) == set(ROW_PASSES) and all(0 < c < 100 for c in passes.values())
    assert passes["_exp_row"] > max(passes["_scale_row"], passes["_sum_row"])
    assert "fmla" in loops.stream_loop(asm["asm"]["pass_exp_row"]).mnemonics  # the polynomial
    model["attention_cycles_per_product"] = 0.25
    assert board.attention_cycles(model, 128) == pytest.approx(
        64 + sum(passes.values()) + passes["_vector_max"]
    )


def test_projection_arithmetic():
    """compute = blocks x cycles / (clock x cores), bandwidth = bytes / GB/s, on a made-up
    model: 10 cycles a block for any tile, 0.5 cycles per attention product and the passes'
    cycles a key (the max pass twice: the softmax's and the weights')."""
    text = {"hidden_size": 64, "head_dim": 16, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256}  # fmt: skip
    passes = {"_scale_row": 1.0, "_vector_max": 0.25, "_exp_row": 2.0, "_sum_row": 0.5,
              "_normalize_row": 1.0, "_round_row": 0.5}  # fmt: skip
    model = {"group": 8, "tile_rows": 4, "attention_cycles_per_product": 0.5,
             "pass_cycles_per_key": passes}  # fmt: skip
    assert board.attention_cycles(model, 16) == 2 * 16 * 0.5 + 5.5
    for fmt in ("q4", "q8", "q8a8"):
        model[fmt] = {n: 10.0 * n for n in range(1, 6)}
    assert board.cycles_per_block(model, "q4", 5) == 50.0
    p = board.project(model, text, "q8", 1, 100, ghz=1.0, cores=2, read_gbs=1.0)
    weights = 2 * (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128) + 256 * 64  # O x K per token
    blocks = weights // (8 * 32)
    query_keys = 2 * 4 * 101  # layers x query heads x keys (one new token)
    assert p["compute_ms"] == pytest.approx((blocks * 10 + query_keys * 21.5) / 2e9 * 1e3)
    kv = 2 * 2 * 101 * (2 * 16 + 8)
    assert p["bandwidth_ms"] == pytest.approx((weights * 34 / 32 + kv) / 1e9 * 1e3)
    assert p["projected_ms"] == max(p["compute_ms"], p["bandwidth_ms"])
    compute_only = board.project(model, text, "q4", 5, 100, ghz=1.0, cores=2, read_gbs=None)
    assert compute_only["bandwidth_ms"] is None and compute_only["bound"] == "compute"
    assert not math.isnan(compute_only["projected_ms"])


def test_an_untrusted_attention_is_projected_again_at_the_host_ratio():
    """When the host check does not trust the attention, every board projection is made a
    second time with the attention's cycles times the host's measured / model ratio, and the
    report prints those figures and flags a row whose bound changes."""
    text = {"hidden_size": 64, "head_dim": 16, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256}  # fmt: skip
    model = {"group": 8, "tile_rows": 4, "attention_cycles_per_product": 0.5, "dot": "sdot"}
    for fmt in ("q4", "q8", "q8a8"):
        model[fmt] = {n: 10.0 * n for n in range(1, 9)}
    b = board.Board("test board", "cortex-a76", "cortex-a76", "", 1.0, 2, 1.0, "nowhere")
    plain = board.board_report(b, model, text, 1.0)
    assert plain["projection_attention_scaled"] == {} and "with the attention" not in "\n".join(
        board._scaled_lines(plain)
    )
    r = board.board_report(b, model, text, 1.0, attention_scale=2.0)
    for key, p in r["projection"].items():
        s = r["projection_attention_scaled"][key]
        assert s["compute_ms"] > p["compute_ms"] and s["bandwidth_ms"] == p["bandwidth_ms"]
    one = board.project(model, text, "q4", 5, 8192, 1.0, 2, None)
    two = board.project(model, text, "q4", 5, 8192, 1.0, 2, None, attention_scale=2.0)
    no_attention = dict(model, attention_cycles_per_product=0.0)
    weights_only = board.project(no_attention, text, "q4", 5, 8192, 1.0, 2, None)["compute_ms"]
    assert two["compute_ms"] - weights_only == pytest.approx(2 * (one["compute_ms"] - weights_only))
    lines = board._scaled_lines(r)
    assert "x 2.00" in lines[0] and len(lines) == 1 + 2 * len(board.FORMATS)
    scaled = r["projection_attention_scaled"]
    flips = [k for k, p in r["projection"].items() if p["bound"] != scaled[k]["bound"]]
    text = "\n".join(lines)
    assert flips and all(f"({scaled[k]['bound']})" in text for k in flips)


def test_the_host_check_times_the_tiles_per_block_and_reports_each_part():
    """The weight check's harness times the real tiles: more activation rows cost more per
    block, and its seconds are plausible (a block is at least one cycle at 6 GHz and not a
    microsecond); the report says per part (weights, attention) whether it is trusted."""
    import numba

    from merlin.engine.kernels.qgroup import GROUP

    clock = board._Clock(2.0)
    numba.set_num_threads(1)
    try:
        # medians of 3 alternating timings: a clean-clone CI with a compiler beside it (load
        # average 8 on 2 CPUs) timed one row slower than five in a single pair
        pairs = [
            [board._per_block(board._weight_times("q4", n, GROUP, clock, 5)) for n in (1, 5)]
            for _ in range(3)
        ]
        one, five = np.median(pairs, axis=0)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert 1 / 6e9 < one < 1e-6 and one < five < 1e-6
    checks = [
        {"kernel": "q4", "N": 1, "model_cycles": 10.0, "measured_cycles": 11.0, "ratio": 0.91,
         "ok": True},
        {"kernel": "attention_q8", "N": 1, "model_cycles": 0.03, "measured_cycles": 0.05,
         "ratio": 0.6, "ok": False},
    ]  # fmt: skip
    result = {
        "llvm_mca": "llvm-mca",
        "host": {
            "cpu": "host",
            "mca_cpu": "host",
            "check": {"ghz": 3.0, "checks": checks, "trusted": {"weights": True,
                                                                 "attention": False}},
        },
        "boards": [],
    }  # fmt: skip
    text = board.report(result)
    assert "weights: model TRUSTED, all 1 host checks within 25%" in text
    assert "attention: model NOT TRUSTED, 1 of 1 host checks outside 25%" in text


def test_intel_unlamination_is_a_rename_slot_per_indexed_computing_instruction(tool):
    body = [
        "vpdpbusd\t-28(%r10,%r14){1to16}, %zmm4, %zmm16",  # computes on base + index: 2 uops
        "vpdpbusd\t-24(%r14){1to16}, %zmm8, %zmm16",  # displacement only: stays fused
        "vmovdqu64\t-8384(%r8,%rax), %zmm2",  # a pure load: one uop
        "vpbroadcastd\t(%r14,%rax,4), %zmm5",
        "addq\t$4, %r11",
    ]
    loop = loops.Loop(".L", body)
    assert loop.text() == "\n".join(body) + "\n"
    assert loop.text(unlaminate=True).split("\n")[:3] == [body[0], "nop", body[1]]
    assert loop.text(unlaminate=True).count("nop") == 1
    # six indexed adds beside six scalar ones: bound by the rename width once unlaminated
    mixed = [f"vpaddd\t(%rax,%rcx,4), %ymm1, %ymm{2 + i}" for i in range(6)]
    mixed += [f"addq\t$1, %r{8 + i}" for i in range(6)]
    loop = loops.Loop(".L", mixed)
    fused = mca.cycles_per_iteration(loop.text(), "x86_64", "icelake-server", tool)
    split = mca.cycles_per_iteration(loop.text(unlaminate=True), "x86_64", "icelake-server", tool)
    assert split > 1.2 * fused


def test_a_core_llvm_mca_does_not_know_gets_the_nearest_model_that_reads_its_listings(tool):
    """Debian 12's llvm-mca (LLVM 14) has no emeraldrapids: the host check fell back to
    x86-64-v3, which refuses every zmm instruction, and `bench board` died on such a host."""
    known = {"sapphirerapids", "icelake-server", "alderlake", "x86-64-v3", "znver3"}
    # LLVM 19's Sapphire Rapids tables are off for the VNNI tiles: Ice Lake server's first
    assert board.nearest_mca_cpu("emeraldrapids", True, known) == "icelake-server"
    assert board.nearest_mca_cpu("sapphirerapids", True, known) == "icelake-server"
    assert board.nearest_mca_cpu("emeraldrapids", True, known - {"icelake-server"}) == (
        "sapphirerapids"
    )
    assert board.nearest_mca_cpu("znver3", False, known) == "znver3"
    assert board.nearest_mca_cpu("znver4", True, known) == "sapphirerapids"
    assert board.nearest_mca_cpu("arrowlake", False, known) == "alderlake"
    assert board.nearest_mca_cpu("a-core-from-2030", True, known) == "sapphirerapids"
    assert board.nearest_mca_cpu("a-core-from-2030", False, known) == "x86-64-v3"
    # this host's choice reads the widest vectors this host's kernels use
    from llvmlite import binding as ll

    widest = "zmm" if "+avx512f" in ll.get_host_cpu_features().flatten().split(",") else "ymm"
    line = f"vpaddd %{widest}1, %{widest}2, %{widest}3"
    cpu = board.host_mca_cpu(tool)
    assert mca.cycles_per_iteration(line, "x86_64-unknown-linux-gnu", cpu, tool) > 0


def test_the_x86_rows_compile_their_own_class_not_this_hosts():
    """An x86 row's kernels are its core's class: with NUMBA_CPU_NAME alone Numba would add
    this host's features (AVX-512 here), and the Zen 3 row's attention came out with zmm
    registers its llvm-mca model refused."""
    expected = {"znver3": ("avx2", 8), "alderlake": ("vnni", 8)}
    rows = [b for b in board.BOARDS if b.triple == board.X86_64]
    assert sorted(b.cpu for b in rows) == sorted(expected)
    for b in rows:
        asm = compile_asm(b.triple, b.cpu, b.features, kernels=("clock",))
        assert (asm["dot"], asm["group"]) == expected[b.cpu]
        assert "zmm" not in asm["asm"]["clock"]


def test_the_verify_limit_is_the_bandwidth_where_five_rows_of_compute_reach_the_target():
    """V(4) <= 1.25 T holds at any bandwidth when five rows compute in 1.25 one row's time;
    otherwise while the step's bytes take at least compute5 / 1.25 to read."""
    rows = {
        "q4 decode 128": {"read_gb": 1.0, "compute_ms": 20.0},
        "q4 V(4) 128": {"read_gb": 1.0, "compute_ms": 80.0},
        "q8 decode 128": {"read_gb": 2.0, "compute_ms": 40.0},
        "q8 V(4) 128": {"read_gb": 2.0, "compute_ms": 50.0},
    }
    assert board.verify_limit_gbs(rows, "q4", 128) == pytest.approx(1.25 * 1.0 / 0.080)
    assert board.verify_limit_gbs(rows, "q8", 128) is None
    # at that bandwidth the projected ratio is exactly the target
    gbs = board.verify_limit_gbs(rows, "q4", 128)
    t, v = max(20.0, 1e3 / gbs), max(80.0, 1e3 / gbs)
    assert v / t == pytest.approx(board.VERIFY_TARGET)
    line = board._verify_limit_line({"verify_limit_gbs": {"q4": gbs, "q8": None}, "cores": 2})
    assert "q4 up to 15.6 GB/s (7.8 a core)" in line and "q8 at any bandwidth" in line


def test_the_host_check_keeps_each_kernels_fastest_round(monkeypatch):
    """A tenant on the same core slows a port-bound loop for seconds at a time: every kernel
    is timed once a round and each of its two sizes keeps its fastest time, so a slow round
    neither fails the check nor, by slowing only the smaller size, makes a kernel look fast."""
    calls = []

    class Clock:
        ghz = 1.0

        def __init__(self, cycles):
            pass

    def slowdowns(key):  # (small size, large size) slowdown of this kernel's round
        calls.append(key)
        # round 1 slows only the smaller size (its difference alone would read fast), round 2
        # is quiet, round 3 slows both
        return {1: (3.0, 1.0), 2: (1.0, 1.0), 3: (1.2, 1.2)}[calls.count(key)]

    def weights(fmt, n, group, clock, repeats):
        slow = slowdowns((fmt, n))
        per_block = 10.0 * n * 1e-9 * board.REPEAT_CALLS
        return {k: (k // board.BLOCK) * per_block * f for k, f in zip(board.WEIGHT_KS, slow)}

    def attention(clock, repeats):
        slow = slowdowns(("attention_q8", 1))
        per_key = 0.5e-9 * 2 * board.ATTENTION_HEAD_DIM * 2
        return {k: k * per_key * f for k, f in zip(board.ATTENTION_KEYS, slow)}

    monkeypatch.setattr(board, "_Clock", Clock)
    monkeypatch.setattr(board, "_weight_times", weights)
    monkeypatch.setattr(board, "_attention_times", attention)
    model = {"group": 8, "tile_rows": 4, "clock_cycles": 2.0, "attention_cycles_per_product": 0.5}
    for fmt in ("q4", "q8"):
        model[fmt] = {n: 10.0 * n for n in range(1, 6)}
    check = board.host_check(model, rounds=3)
    assert len(calls) == 3 * 11 and calls[:11] == calls[11:22]  # round by round
    assert [c["ratio"] for c in check["checks"]] == pytest.approx([1.0] * 11)
    assert check["all_trusted"]
