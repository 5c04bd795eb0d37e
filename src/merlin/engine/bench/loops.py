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
            attention's loops are scaled by these.
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
        return [line.split()[0] for line in self.body]

    def count(self, *names: str) -> int:
        return sum(m in names for m in self.mnemonics)

    @property
    def converts(self) -> int:
        """int32 -> f32 lanes converted in one iteration."""
        return sum(_lanes(line) for line in self.body if line.split()[0] in ("vcvtdq2ps", "scvtf"))

    @property
    def products(self) -> int:
        """Integer multiply lanes in one iteration (see the module docstring)."""
        total = 0
        for line in self.body:
            m = line.split()[0]
            if m in _DOT_PER_LANE:
                total += _DOT_PER_LANE[m] * _lanes(line)
            elif m in _MUL_X86 or (m in _MUL_ARM and "." in line):
                total += _lanes(line, widest=True)
        return total

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


def _unlaminated(line: str) -> bool:
    """An x86 instruction that both reads memory through base + index and computes (a pure
    load, store, broadcast or prefetch stays one uop)."""
    return bool(_INDEXED.search(line)) and not line.split()[0].startswith(_PURE_MEMORY)


def _lanes(line: str, widest: bool = False) -> int:
    """Vector lanes of an instruction's destination (x86: its last operand, AT&T; AArch64:
    the first), in elements of that operand (widest: x86's vpmullw in its 16-bit lanes); a
    scalar instruction counts 1."""
    if "\t" in line or " " in line:
        operands = line.split(None, 1)[1]
    else:
        return 1
    arm = _ARM_ARRANGEMENT.findall(operands)
    if arm:
        return int(arm[0][0])
    regs = re.findall(r"%([xyz]mm)\d+", operands)
    if regs:
        width = _VEC_X86[regs[-1]]
        if widest:
            # vpmullw: 16-bit lanes, twice the 32-bit count
            return width * (2 if line.split()[0] == "vpmullw" else 1)
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


def product_loops(asm: str, min_products: int = 16) -> list[Loop]:
    """Loops doing integer multiplies (at least min_products lanes an iteration)."""
    return [loop for loop in find_loops(asm) if loop.products >= min_products]
