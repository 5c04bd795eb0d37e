"""Markdown preparation and math as Unicode (Qt-free)."""

import pytest

from merlin.app.model.markdown import code_blocks, prepare, stable_length
from merlin.app.model.mathtext import latex_to_unicode


@pytest.mark.parametrize(
    "tex, text",
    [
        (r"\frac{a+b}{2}", "(a+b)/2"),
        (r"x^2 + y_i", "x² + yᵢ"),
        (r"\alpha \le \beta", "α ≤ β"),
        (r"\sqrt{x^2+1}", "√(x²+1)"),
        (r"\sum_{i=1}^{n} i", "∑ᵢ₌₁ⁿ i"),
        (r"\mathbb{R}^n", "ℝⁿ"),
        (r"\text{area} = \pi r^2", "area = π r²"),
        (r"e^{i\pi} + 1 = 0", "e^(iπ) + 1 = 0"),
        (r"\unknowncommand{x}", "unknowncommandx"),
        (r"\frac{1}{", "1/"),  # unbalanced: never raises
    ],
)
def test_latex_to_unicode(tex, text):
    assert latex_to_unicode(tex) == text


def test_prepare_renders_math_but_never_code():
    src = (
        "Area: $\\pi r^2$, price $5 or $10.\n\n"
        "\\[ \\frac{1}{2} \\]\n\n"
        "Inline `$x$` stays.\n\n"
        "```python\nx = '$a^2$'\n```\n"
    )
    out = prepare(src)
    assert "*π r²*" in out
    assert "$5 or $10" in out  # currency is not math
    assert "*1/2*" in out
    assert "`$x$`" in out
    assert "x = '$a^2$'" in out


def test_stable_length_stops_before_open_code_fence_and_formula():
    assert stable_length("one\n\ntwo") == len("one\n\n")
    src = "intro\n\n```py\nx = 1\n\ny = 2\n"
    assert stable_length(src) == len("intro\n\n")  # the blank line inside the fence is not a break
    src = "intro\n\n$$\na\n\nb"
    assert stable_length(src) == len("intro\n\n")
    assert stable_length("no break yet") == 0
    src = "a \\[ x\n\nb \\] c\n\nd"
    assert stable_length(src) == len("a \\[ x\n\nb \\] c\n\n")  # the formula closed


def test_formula_marks_inside_code_do_not_hold_the_stream_back():
    """`echo $$` in a shell block is not a formula: the blocks after it are finished."""
    src = "Run:\n\n```sh\necho $$\n```\n\nThen this.\n\nand"
    assert stable_length(src) == len(src) - len("and")


def test_code_blocks():
    assert code_blocks("a\n```python\nprint(1)\n```\nb\n~~~\nraw\n~~~\n") == [
        ("python", "print(1)"),
        ("", "raw"),
    ]
