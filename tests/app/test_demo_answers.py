"""The GUI on the shipped demo model answers questions about pictures right (offscreen, as a
user: attach a drawn picture, type, press Enter), in English and Chinese, f32 and q4 weights;
and its banner says what the model is."""

from __future__ import annotations

import pytest
from gui_helpers import data_dir, make_window, send  # noqa: F401

from merlin.engine import demo_scenes as ds

SCENE = ds.Scene(
    (ds.Shape("circle", "red", "big", "left"), ds.Shape("square", "blue", "small", "right")),
    seed=101,
)
QUESTIONS = [
    pytest.param("en", "What colour is the circle?", "colour", "circle", id="en"),
    pytest.param("zh", "圆形是什么颜色的？", "colour", "circle", id="zh"),
]  # fmt: skip


def answer_text(window) -> str:
    c = window.controller
    rows = c.store.messages(c.current_id)
    assert rows and rows[-1].role == "assistant"
    return rows[-1].text.strip()


@pytest.mark.parametrize("weights", ["f32", "q4"])
@pytest.mark.parametrize("lang,question,kind,shape", QUESTIONS)
def test_gui_answers_about_a_drawn_picture(
    qtbot, make_window, shapes_dir, tmp_path, weights, lang, question, kind, shape
):
    w = make_window(model=str(shapes_dir), weights=weights, kv="q8", max_new_tokens=40)
    assert w.controller.model.demo_model
    assert "trained on pictures of shapes" in w.model_banner.text()
    picture = tmp_path / "shapes.png"
    ds.draw(SCENE, 320, 240).save(picture)
    w.composer.add_paths([str(picture)])
    w.composer.wait_attachments()
    send(qtbot, w, question)
    assert answer_text(w) == ds.answer(SCENE, kind, lang, shape), (weights, question)
