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
    view.show_streamed()  # what a render's spacing held back
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


def test_a_long_streamed_tail_is_rendered_at_a_pace_the_window_can_bear(qtbot):
    """An open code block's tail is re-rendered whole at every refresh; calls that come
    faster than STREAM_SPACING of those renders are held back and the newest text is shown
    by a timer; the finished render supersedes anything held back."""
    view = MessageText()
    qtbot.addWidget(view)
    view.resize(700, 100)
    view.show()
    renders = []
    real = view._render_stream
    view._render_stream = lambda src: renders.append(len(src)) or real(src)
    code = "Here:\n\n```python\n" + "".join(f"x{i} = {i} * 2  # step\n" for i in range(600))
    view.stream(code)
    for i in range(50):  # tokens arriving while the first render's spacing runs
        view.stream(code + f"y = {i}\n")
    assert len(renders) == 1
    qtbot.waitUntil(lambda: "y = 49" in view.document().toPlainText(), timeout=10_000)
    assert len(renders) == 2  # one render for the 50 held back: the newest text
    view.stream(code + "z = 1\n")
    view.stream(code + "z = 2\n")  # held back
    view.render_markdown(code + "```\n\nDone.")
    qtbot.wait(100)
    text = view.document().toPlainText()
    assert "Done." in text and "z = 2" not in text


def test_a_long_run_without_spaces_wraps_anywhere_and_prose_at_words(qtbot):
    """A pasted base64 blob or minified JSON: Qt's word wrap searched the whole run for a
    boundary at every line (quadratic: 100,000 characters froze the window 9 s at each send,
    opening and resize); such a text wraps anywhere, prose still at word boundaries."""
    from PySide6.QtGui import QTextOption

    from merlin.app.widgets.message_text import LONG_RUN

    view = MessageText()
    qtbot.addWidget(view)
    view.resize(600, 100)
    view.show()
    blob = "eyJhbGciOiJIUzI1NiJ9" * (LONG_RUN // 10)
    prose = "word " * LONG_RUN
    for render in (view.render_plain, view.render_markdown):
        render(f"see {blob} here")
        assert view.wordWrapMode() == QTextOption.WrapAnywhere
        assert view.height() > 10 * view.fontMetrics().height()  # wrapped into many lines
        assert blob in view.document().toPlainText()  # the text itself is untouched
        render(prose)
        assert view.wordWrapMode() == QTextOption.WrapAtWordBoundaryOrAnywhere
    render(("中文没有空格但每个字之间都可以换行。" * LONG_RUN)[: 3 * LONG_RUN])  # CJK: breaks
    assert view.wordWrapMode() == QTextOption.WrapAtWordBoundaryOrAnywhere  # anywhere already
    view.stream("x" * (LONG_RUN - 1))
    view.show_streamed()
    assert view.wordWrapMode() == QTextOption.WrapAtWordBoundaryOrAnywhere
    view.stream("x" * LONG_RUN)
    view.show_streamed()
    assert view.wordWrapMode() == QTextOption.WrapAnywhere
