"""The window renders at 1280x720 and 1920x1080, in English and Simplified Chinese, in normal
and demo mode. Screenshots go to $MERLIN_SHOTS (if set) for a person to look at."""

import os
from pathlib import Path

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)
from PySide6.QtCore import Qt

from merlin.app.modes.demo_image import draw_demo_image

MARKDOWN = """## Result

The answer has **bold**, `inline code`, a list:

1. first
2. second

| tokens | ms |
| --- | --- |
| 1 | 20 |

```python
def boats(image):
    return 1  # one boat
```

Math: $a^2 + b^2 = c^2$ and \\[ \\frac{1}{2} \\sum_i x_i \\]
"""


@pytest.mark.parametrize("language", ["en", "zh_CN"])
def test_window_renders_at_both_sizes(qtbot, make_window, tmp_path, language):
    w = make_window(language=language)
    image = draw_demo_image(tmp_path / "lake.png")
    w.composer.add_paths([str(image)])
    w.composer.wait_attachments()
    send(qtbot, w, "What is in this picture?")
    # an answer with every kind of markdown, rendered as a finished message
    c = w.controller
    w.chat.add_message(10_000, "assistant", MARKDOWN, state="done", stats={"tokens": 42})
    body = w.chat.messages()[-1].body
    assert body.code_texts == ["def boats(image):\n    return 1  # one boat"]
    plain = body.toPlainText()
    assert "a² + b² = c²" in plain and "(1/2)" not in plain and "1/2" in plain
    if language == "zh_CN":
        assert w.menu_chat.title() == "对话(&C)"
        assert w.chat.messages()[0].who.text() == "你"
    else:
        assert w.menu_chat.title() == "&Chat"
    shots = os.environ.get("MERLIN_SHOTS")
    for size, demo in (((1280, 720), False), ((1920, 1080), False), ((1920, 1080), True)):
        w.set_demo_mode(demo)
        w.resize(*size)
        qtbot.wait(50)
        w.panel.refresh(force=True)
        pixmap = w.grab()
        assert pixmap.width() == size[0] and pixmap.height() == size[1]
        assert w.panel.isVisible()
        if demo:
            assert w.panel.width() > 0.35 * size[0] and not w.conversations.isVisible()
        name = f"window-{language}-{size[0]}x{size[1]}{'-demo' if demo else ''}.png"
        out = Path(shots) if shots else tmp_path
        out.mkdir(parents=True, exist_ok=True)
        assert pixmap.save(str(out / name))
    w.set_demo_mode(False)
    assert c.model is not None


def test_language_switches_at_run_time(qtbot, make_window):
    w = make_window()
    assert w.act_settings.text() == "Settings…"
    new = type(w.settings)(**vars(w.settings))
    new.language = "zh_CN"
    w.apply_settings(new)
    assert w.act_settings.text() == "设置…"
    # widgets re-read their texts on the LanguageChange event Qt posts to them
    qtbot.waitUntil(lambda: w.composer.send_button.text() == "发送", timeout=5000)
    assert w.panel.title.text() == "性能"
    assert w.conversations.search.placeholderText() == "搜索对话"
    new.language = "en"
    w.apply_settings(new)
    qtbot.waitUntil(lambda: w.composer.send_button.text() == "Send", timeout=5000)


def test_panel_toggle_and_fullscreen_actions(qtbot, make_window):
    w = make_window()
    qtbot.keyClick(w, Qt.Key_F9)
    assert not w.panel.isVisible() and not w.settings.panel_visible
    qtbot.keyClick(w, Qt.Key_F9)
    assert w.panel.isVisible()
    w.toggle_fullscreen(True)
    assert w.act_full.isChecked()
    w.toggle_fullscreen(False)
