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
