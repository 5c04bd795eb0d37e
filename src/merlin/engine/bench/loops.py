"""Single-block loops in an assembly listing (x86-64 AT&T or AArch64, as LLVM prints them),
and what one iteration of each does: what llvm-mca is given and how its cycles are scaled.

A loop here is a label L and the straight run of instructions after it up to the last branch
back to L with no other label in between (a block that is its own latch, LLVM's shape for a
kernel's innermost loop once everything in it is inlined and unrolled). Per loop:

  converts  float lanes converted from int32 (vcvtdq2ps, scvtf): the grouped weight kernels
            convert one GROUP-lane vector per activation row and 32-weight block, so
            converts / GROUP is the tile's row count;
  products  integer multiply lanes (dot instructions count each product: vpdpbusd 4 a lane,
            vpdpwssd / vpmaddwd 2, sdot 4; plain multiplies 1 a lane of their destination,
            so a widening smull2 / smlal2 of 8 halfwords into 4 words counts 4): the
            attention's loops are scaled by these;
  elements  32-bit lanes loaded an iteration through its busiest address (base and index
            registers; constants from a literal pool and reloads of spilled registers from the
            stack left out): the keys one iteration
            of a pass over a row of f32 scores handles (attention.ROW_PASSES), whatever the
            vector width and unrolling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMMENT = re.compile(r"(//.*|(^|\s)#(\s.*|$))$")  # AArch64 "//", x86 "# ..." (not "#16")
_LABEL = re.compile(r"^([.\w$]+):")
_VEC_X86 = {"xmm": 4, "ymm": 8, "zmm": 16}  # 32-bit lanes
_ARM_ARRANGEMENT = re.compile(r"\bv\d+\.(\d+)([bhsd])\b")
# products per 32-bit result lane of a dot instruction
_DOT_PER_LANE = {"vpdpbusd": 4, "vpdpbusds": 4, "vpdpwssd": 2, "vpdpwssds": 2, "vpmaddwd": 2}
_DOT_PER_LANE |= {"sdot": 4, "udot": 4, "usdot": 4, "vpmaddubsw": 1}
_MUL_X86 = ("vpmulld", "vpmullw", "vpmuldq", "vpmuludq")
_MUL_ARM = ("mul", "mla", "smull", "smull2", "umull", "umull2", "smlal", "smlal2", "umlal")
_MUL_ARM += ("umlal2",)


@dataclass
class Loop:
    label: str
    body: list[str]  # instructions, one a line, as in the listing (tab separated)

    @property
    def mnemonics(self) -> list[str]:
        return [_mnemonic(line) for line in self.body]

    def count(self, *names: str) -> int:
        return sum(m in names for m in self.mnemonics)

    @property
    def converts(self) -> int:
        """int32 -> f32 lanes converted in one iteration."""
        return sum(_lanes(line) for line in self.body if _mnemonic(line) in ("vcvtdq2ps", "scvtf"))

    @property
    def products(self) -> int:
        """Integer multiply lanes in one iteration (see the module docstring)."""
        total = 0
        for line in self.body:
            m = _mnemonic(line)
            if m in _DOT_PER_LANE:
                total += _DOT_PER_LANE[m] * _lanes(line)
            elif m in _MUL_X86 or (m in _MUL_ARM and "." in line):
                total += _lanes(line, widest=True)
        return total

    @property
    def elements(self) -> float:
        """32-bit lanes loaded an iteration through its busiest address (module docstring)."""
        per_base: dict[str, float] = {}
        for line in self.body:
            found = _load(line)
            if found:
                per_base[found[0]] = per_base.get(found[0], 0.0) + found[1]
        return max(per_base.values(), default=0.0)

    def text(self, unlaminate: bool = False) -> str:
        """The body for llvm-mca; unlaminate: Intel's split of an instruction that computes
        on a base + index memory operand into two uops at rename, which llvm-mca's Intel
        models count as one (measured on an Intel core in docs/kernels.md, "The verify tile
        against DRAM"): a nop (a rename slot, no port) goes after each."""
        body = []
        for line in self.body:
            body.append(line)
            if unlaminate and _unlaminated(line):
                body.append("nop")
        return "\n".join(body) + "\n"


_INDEXED = re.compile(r"\(%\w+,%\w+(,\d)?\)")  # AT&T base + index (x scale) operand
_PURE_MEMORY = ("mov", "vmov", "vpbroadcast", "vbroadcast", "prefetch", "lea", "push", "pop")


def _split(line: str) -> tuple[str, str]:
    """(mnemonic, operands) of a listing line; an encoding pseudo-prefix is skipped (AVX-VNNI's
    dots print as "{vex} vpdpbusd ...")."""
    parts = line.split(None, 1)
    if parts and parts[0] in ("{vex}", "{vex3}", "{evex}") and len(parts) > 1:
        parts = parts[1].split(None, 1)
    return (parts[0], parts[1] if len(parts) > 1 else "") if parts else ("", "")


def _mnemonic(line: str) -> str:
    return _split(line)[0]


def _unlaminated(line: str) -> bool:
    """An x86 instruction that both reads memory through base + index and computes (a pure
    load, store, broadcast or prefetch stays one uop)."""
    return bool(_INDEXED.search(line)) and not _mnemonic(line).startswith(_PURE_MEMORY)


_X86_MEMORY = re.compile(r"[-\w]*\((%\w+)?(,%\w+)?(,\d)?\)")
_ARM_MEMORY = re.compile(r"\[(\w+)(?:,\s*(\w+))?[^\]]*\]")
_ARM_REGISTER_LANES = {"q": 4, "d": 2, "s": 1, "h": 0.5, "b": 0.25, "x": 2, "w": 1}


def _load(line: str) -> tuple[str, float] | None:
    """(address registers, 32-bit lanes) of an instruction that reads memory; None for any
    other, a store, or a constant from the literal pool."""
    mnemonic, operands = _split(line)
    if not operands or ":lo12:" in operands or "%rip" in operands:
        return None  # a constant
    if "(%rsp" in operands or "[sp" in operands:
        return None  # a spilled register reloaded
    arm = _ARM_MEMORY.search(operands)
    if arm:
        if not mnemonic.startswith("ld"):
            return None
        regs = operands[: arm.start()]
        arranged = _ARM_ARRANGEMENT.findall(regs)
        if arranged:  # ld1 {v0.4s, v1.4s}, ...
            lanes = sum(int(n) * {"b": 0.25, "h": 0.5, "s": 1, "d": 2}[t] for n, t in arranged)
        else:
            names = re.findall(r"\b([qdshbxw])\d+\b", regs)
            lanes = sum(_ARM_REGISTER_LANES[r] for r in names)
        return ",".join(r for r in arm.groups() if r), lanes
    x86 = _X86_MEMORY.search(operands)
    bare = re.sub(r"\s*\{%k\d\}(\{z\})?\s*$", "", operands)  # an AVX-512 mask
    if not x86 or bare.rstrip().endswith(")") or "scatter" in mnemonic:
        return None  # no memory operand, or it is the destination: a store
    if mnemonic.startswith(("lea", "prefetch", "nop")):
        return None  # an address computed, not read
    base = "".join(g for g in x86.groups()[:2] if g)
    scalar_fp = not mnemonic.startswith(("vp", "p"))  # vpdpwssd is packed
    if (scalar_fp and mnemonic.endswith("ss")) or mnemonic in ("vbroadcastss", "vpbroadcastd"):
        lanes = 1
    elif (scalar_fp and mnemonic.endswith("sd")) or mnemonic in ("vmovq", "vpbroadcastq"):
        lanes = 2
    elif mnemonic in ("vmovd", "movd"):
        lanes = 1
    else:
        lanes = _lanes(line)
    return base, lanes


def _lanes(line: str, widest: bool = False) -> int:
    """Vector lanes of an instruction's destination (x86: its last operand, AT&T; AArch64:
    the first), in elements of that operand (widest: x86's vpmullw in its 16-bit lanes); a
    scalar instruction counts 1."""
    mnemonic, operands = _split(line)
    if not operands:
        return 1
    arm = _ARM_ARRANGEMENT.findall(operands)
    if arm:
        return int(arm[0][0])
    regs = re.findall(r"%([xyz]mm)\d+", operands)
    if regs:
        width = _VEC_X86[regs[-1]]
        if widest:
            # vpmullw: 16-bit lanes, twice the 32-bit count
            return width * (2 if mnemonic == "vpmullw" else 1)
        return width
    return 1


def _instructions(asm: str):
    """(label or None, instruction) per line, directives and comments dropped."""
    for raw in asm.splitlines():
        line = _COMMENT.sub("", raw).strip()
        m = _LABEL.match(line)
        if m:
            yield m.group(1), None
            continue
        if not line or line.startswith("."):
            continue
        yield None, line


def _branch_target(line: str) -> str | None:
    parts = line.replace(",", " ").split()
    m = parts[0]
    is_branch = m.startswith(("j", "b.", "cb", "tb")) or m == "b"
    return parts[-1] if is_branch and len(parts) > 1 else None


def find_loops(asm: str) -> list[Loop]:
    """Every single-block loop of the listing, in order."""
    loops, label, run = [], None, []
    for lab, ins in _instructions(asm):
        if lab is not None:
            label, run = lab, []
            continue
        if label is None:
            continue
        run.append(ins)
        if _branch_target(ins) == label and ins.split()[0] not in ("b", "jmp"):
            loops.append(Loop(label, list(run)))
    # the last back-branch of a label wins (a label seen twice keeps its longest run)
    longest: dict[str, Loop] = {}
    for loop in loops:
        if loop.label not in longest or len(loop.body) > len(longest[loop.label].body):
            longest[loop.label] = loop
    return list(longest.values())


def tile_loops(asm: str, group: int) -> dict[int, Loop]:
    """The block loops of a grouped weight kernel by their tile's row count (converts /
    group); where one row count has several loops (copies LLVM made), the longest."""
    out: dict[int, Loop] = {}
    for loop in find_loops(asm):
        rows, rest = divmod(loop.converts, group)
        if rows and not rest and (rows not in out or len(loop.body) > len(out[rows].body)):
            out[rows] = loop
    return dict(sorted(out.items()))


def stream_loop(asm: str) -> Loop:
    """A pass's main loop: the one loading the most lanes an iteration through one address
    (its vector body; remainder and scalar copies load fewer). Raises ValueError if none
    loads."""
    found = [loop for loop in find_loops(asm) if loop.elements > 0]
    if not found:
        raise ValueError("no loop loading from memory in the listing")
    return max(found, key=lambda loop: (loop.elements, len(loop.body)))


def product_loops(asm: str, min_products: int = 16) -> list[Loop]:
    """Loops doing integer multiplies (at least min_products lanes an iteration)."""
    return [loop for loop in find_loops(asm) if loop.products >= min_products]
