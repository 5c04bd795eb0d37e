"""LaTeX math as readable Unicode text: `\\frac{a}{b}` -> a/b, `x^2` -> x², `\\alpha` -> α.

Qwen models write math as `$...$`, `\\(...\\)`, `$$...$$` and `\\[...\\]`. A full TeX renderer
is heavy; plain Unicode covers what chat answers contain (Greek, operators, arrows, sub- and
superscripts, fractions, roots, accents) and stays selectable and copyable. Qt-free.
Unknown commands keep their name without the backslash, so nothing silently disappears.
"""

from __future__ import annotations

SYMBOLS = {
    # Greek
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "delta": "δ",
    "epsilon": "ε",
    "varepsilon": "ε",
    "zeta": "ζ",
    "eta": "η",
    "theta": "θ",
    "vartheta": "ϑ",
    "iota": "ι",
    "kappa": "κ",
    "lambda": "λ",
    "mu": "μ",
    "nu": "ν",
    "xi": "ξ",
    "pi": "π",
    "varpi": "ϖ",
    "rho": "ρ",
    "varrho": "ϱ",
    "sigma": "σ",
    "varsigma": "ς",
    "tau": "τ",
    "upsilon": "υ",
    "phi": "φ",
    "varphi": "φ",
    "chi": "χ",
    "psi": "ψ",
    "omega": "ω",
    "Gamma": "Γ",
    "Delta": "Δ",
    "Theta": "Θ",
    "Lambda": "Λ",
    "Xi": "Ξ",
    "Pi": "Π",
    "Sigma": "Σ",
    "Upsilon": "Υ",
    "Phi": "Φ",
    "Psi": "Ψ",
    "Omega": "Ω",
    # operators and relations
    "cdot": "·",
    "times": "×",
    "div": "÷",
    "pm": "±",
    "mp": "∓",
    "ast": "∗",
    "star": "⋆",
    "circ": "∘",
    "bullet": "•",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "neq": "≠",
    "ne": "≠",
    "approx": "≈",
    "equiv": "≡",
    "sim": "∼",
    "simeq": "≃",
    "cong": "≅",
    "propto": "∝",
    "ll": "≪",
    "gg": "≫",
    "in": "∈",
    "notin": "∉",
    "ni": "∋",
    "subset": "⊂",
    "subseteq": "⊆",
    "supset": "⊃",
    "supseteq": "⊇",
    "cup": "∪",
    "cap": "∩",
    "setminus": "∖",
    "emptyset": "∅",
    "varnothing": "∅",
    "forall": "∀",
    "exists": "∃",
    "nexists": "∄",
    "neg": "¬",
    "lnot": "¬",
    "land": "∧",
    "wedge": "∧",
    "lor": "∨",
    "vee": "∨",
    "oplus": "⊕",
    "otimes": "⊗",
    "perp": "⊥",
    "parallel": "∥",
    "mid": "∣",
    "angle": "∠",
    "triangle": "△",
    "infty": "∞",
    "partial": "∂",
    "nabla": "∇",
    "hbar": "ℏ",
    "ell": "ℓ",
    "Re": "ℜ",
    "Im": "ℑ",
    "aleph": "ℵ",
    "degree": "°",
    "prime": "′",
    "sum": "∑",
    "prod": "∏",
    "coprod": "∐",
    "int": "∫",
    "iint": "∬",
    "iiint": "∭",
    "oint": "∮",
    "sqrt": "√",
    # arrows
    "to": "→",
    "rightarrow": "→",
    "leftarrow": "←",
    "gets": "←",
    "leftrightarrow": "↔",
    "Rightarrow": "⇒",
    "Leftarrow": "⇐",
    "Leftrightarrow": "⇔",
    "implies": "⟹",
    "iff": "⟺",
    "mapsto": "↦",
    "uparrow": "↑",
    "downarrow": "↓",
    "longrightarrow": "⟶",
    "longleftarrow": "⟵",
    "rightleftharpoons": "⇌",
    # dots, spaces, delimiters
    "ldots": "…",
    "dots": "…",
    "cdots": "⋯",
    "vdots": "⋮",
    "ddots": "⋱",
    "quad": "  ",
    "qquad": "    ",
    ",": " ",
    ";": " ",
    ":": " ",
    "!": "",
    " ": " ",
    "{": "{",
    "}": "}",
    "%": "%",
    "$": "$",
    "&": "&",
    "#": "#",
    "_": "_",
    "|": "‖",
    "langle": "⟨",
    "rangle": "⟩",
    "lceil": "⌈",
    "rceil": "⌉",
    "lfloor": "⌊",
    "rfloor": "⌋",
    "lvert": "|",
    "rvert": "|",
    "vert": "|",
    "lVert": "‖",
    "rVert": "‖",
    "backslash": "\\",
    "therefore": "∴",
    "because": "∵",
    "checkmark": "✓",
    # named functions stay words
    **{
        f: f
        for f in (
            "sin",
            "cos",
            "tan",
            "cot",
            "sec",
            "csc",
            "arcsin",
            "arccos",
            "arctan",
            "sinh",
            "cosh",
            "tanh",
            "log",
            "ln",
            "lg",
            "exp",
            "lim",
            "max",
            "min",
            "sup",
            "inf",
            "det",
            "gcd",
            "deg",
            "arg",
            "dim",
            "ker",
            "mod",
            "Pr",
        )
    },
}
BLACKBOARD = {"R": "ℝ", "N": "ℕ", "Z": "ℤ", "Q": "ℚ", "C": "ℂ", "P": "ℙ", "E": "𝔼"}
ACCENTS = {
    "hat": "\u0302",
    "widehat": "\u0302",
    "bar": "\u0304",
    "overline": "\u0305",
    "vec": "\u20d7",
    "dot": "\u0307",
    "ddot": "\u0308",
    "tilde": "\u0303",
    "widetilde": "\u0303",
    "underline": "\u0332",
}
TEXT_COMMANDS = (
    "text",
    "textrm",
    "textbf",
    "textit",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mathtt",
    "operatorname",
    "boldsymbol",
    "bm",
    "mbox",
    "displaystyle",
    "textstyle",
    "boxed",
    "mathcal",
    "mathscr",
    "mathfrak",
)
DROP = (
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "limits",
    "nolimits",
    "displaystyle",
    "textstyle",
    "scriptstyle",
)
SUPERSCRIPT = dict(zip("0123456789+-=()nia", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵃ"))
SUPERSCRIPT.update({"T": "ᵀ", "k": "ᵏ", "x": "ˣ", "*": "*", "′": "′", "'": "′"})
SUBSCRIPT = dict(zip("0123456789+-=()aeoxhklmnpstij", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼ"))


class _Parser:
    def __init__(self, src: str):
        self.s = src
        self.i = 0

    def parse(self, stop: str | None = None) -> str:
        out: list[str] = []
        while self.i < len(self.s):
            ch = self.s[self.i]
            if stop is not None and ch == stop:
                self.i += 1
                return "".join(out)
            if ch == "{":
                self.i += 1
                out.append(self.parse("}"))
            elif ch == "}":
                self.i += 1  # unbalanced: drop it
            elif ch == "\\":
                out.append(self.command())
            elif ch in "^_":
                self.i += 1
                arg = self.argument()
                out.append(_script(arg, SUPERSCRIPT if ch == "^" else SUBSCRIPT, ch))
            elif ch == "~":
                self.i += 1
                out.append(" ")
            elif ch == "&":
                self.i += 1
                out.append(" ")
            elif ch == "'":
                self.i += 1
                out.append("′")
            else:
                self.i += 1
                out.append(ch)
        return "".join(out)

    def argument(self) -> str:
        """One argument: a {group}, a \\command or a single character."""
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1
        if self.i >= len(self.s):
            return ""
        ch = self.s[self.i]
        if ch == "{":
            self.i += 1
            return self.parse("}")
        if ch == "\\":
            return self.command()
        self.i += 1
        return ch

    def optional(self) -> str | None:
        if self.i < len(self.s) and self.s[self.i] == "[":
            end = self.s.find("]", self.i)
            if end > 0:
                value = _Parser(self.s[self.i + 1 : end]).parse()
                self.i = end + 1
                return value
        return None

    def command(self) -> str:
        self.i += 1  # backslash
        if self.i >= len(self.s):
            return ""
        start = self.i
        if self.s[self.i].isalpha():
            while self.i < len(self.s) and self.s[self.i].isalpha():
                self.i += 1
        else:
            self.i += 1
        name = self.s[start : self.i]
        if name == "\\":  # line break in aligned environments
            return "; "
        if name in ("frac", "dfrac", "tfrac", "cfrac"):
            num, den = self.argument(), self.argument()
            return f"{_wrap(num)}/{_wrap(den)}"
        if name == "binom":
            n, k = self.argument(), self.argument()
            return f"C({n}, {k})"
        if name == "sqrt":
            degree = self.optional()
            root = {"3": "∛", "4": "∜"}.get(degree or "", "√")
            prefix = "" if degree in (None, "3", "4") else _script(degree, SUPERSCRIPT, "^")
            return prefix + root + _wrap(self.argument())
        if name == "mathbb":
            arg = self.argument()
            return "".join(BLACKBOARD.get(c, c) for c in arg)
        if name in ACCENTS:
            arg = self.argument()
            mark = ACCENTS[name]
            return arg + mark if len(arg) == 1 else f"{arg}{mark}"
        if name in ("begin", "end"):
            self.argument()  # environment name: matrices read as rows separated by ';'
            return ""
        if name in DROP:
            return ""
        if name in TEXT_COMMANDS:
            return self.argument()
        if name in SYMBOLS:
            return SYMBOLS[name]
        return name


def _wrap(text: str) -> str:
    """Parenthesise a fraction part or root argument unless it is one simple term."""
    text = text.strip()
    if len(text) <= 1 or text.isalnum() or (text.startswith("(") and text.endswith(")")):
        return text
    return f"({text})"


def _script(text: str, table: dict[str, str], mark: str) -> str:
    text = text.strip()
    if text and all(c in table for c in text):
        return "".join(table[c] for c in text)
    if len(text) == 1:
        return mark + text
    return f"{mark}({text})"


def latex_to_unicode(src: str) -> str:
    """The Unicode reading of one math expression (without its $ or \\[ delimiters)."""
    out = _Parser(src).parse()
    return " ".join(out.split()) if "\n" in out else out.strip()
