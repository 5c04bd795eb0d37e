"""Model text is rendered as text: HTML-looking tags in an answer are shown as written, never
interpreted, and never hide what follows them (finished render and streaming alike)."""

import pytest

from merlin.app.widgets.message_text import MessageText

CASES = [
    ("Reasoning here.</think>\n\nThe answer is Paris.", ["</think>", "The answer is Paris."]),
    ("Use the <b> tag to make text bold", ["<b> tag to make text bold"]),
    ("<script>alert(1)</script> after", ["<script>alert(1)</script> after"]),
    ("a <div>x</div> and <!-- c --> end", ["<div>x</div>", "<!-- c --> end"]),
    ("<img src=x onerror=y> tail", ["<img src=x onerror=y> tail"]),
    ("Keep **bold** and `<i>` code", ["bold", "<i>"]),
]


@pytest.mark.parametrize("src, shown", CASES)
def test_tags_are_text_when_rendered(qtbot, src, shown):
    view = MessageText()
    qtbot.addWidget(view)
    view.render_markdown(src)
    text = view.document().toPlainText()
    for piece in shown:
        assert piece in text


@pytest.mark.parametrize("src, shown", CASES)
def test_tags_are_text_while_streaming(qtbot, src, shown):
    view = MessageText()
    qtbot.addWidget(view)
    for end in range(1, len(src) + 1, 3):  # token by token, as an answer arrives
        view.stream(src[:end])
    view.stream(src)
    text = view.document().toPlainText()
    for piece in shown:
        assert piece in text


def test_markdown_still_formats(qtbot):
    view = MessageText()
    qtbot.addWidget(view)
    view.render_markdown("**bold** and *it*")
    assert view.document().toPlainText() == "bold and it"


def test_finishing_a_code_answer_lays_it_out_once(qtbot):
    """Syntax colours, inline-code backgrounds, drafted tints and copy links are one edit of
    the document: each of them had re-laid out the whole message (an 800-line code answer
    took two minutes to finish on the GUI thread, the window frozen)."""
    view = MessageText()
    qtbot.addWidget(view)
    view.resize(700, 100)
    view.show()
    lines = "".join(f"def f{i}(x):\n    return x * {i} + len('abc')  # note\n" for i in range(100))
    src = f"Here is `code`:\n\n```python\n{lines}```\n\nand `more` after."
    layouts = []
    view.document().documentLayout().documentSizeChanged.connect(lambda _: layouts.append(1))
    view.render_markdown(src)
    view.mark_drafted(src, [(0, 40), (60, 400)])
    assert len(layouts) <= 8, len(layouts)
    assert view.code_texts and "def f99" in view.code_texts[0]
    assert view.height() > 100 * 2 * view.fontMetrics().lineSpacing() * 0.8  # fitted after
