"""Thinking models in the app: the store's migration from schemas 1 and 2 (databases made by
the stores before thinking models, tests/app/data/make_old_db.py), the reasoning block
(collapsed, expanded by click and keyboard, left out of Copy, stored and shown again), the
per-chat switch (disabled with its reason on the demo model, kept with the chat, sent to the
engine), and a real answer of a thinking checkpoint with the budget setting."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from gui_helpers import data_dir, make_window, send, wait_idle  # noqa: F401 (fixtures)
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from thinking_fixtures import THINKING_TEMPLATE, checkpoint_with_template

from merlin.app.model.store import SCHEMA_VERSION, Store
from merlin.engine.generate import Finished, Tokens
from merlin.engine.profile import StepProfile

OLD_DBS = Path(__file__).parent / "data"  # made by older stores: data/make_old_db.py


# ---- the store ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_migration_from_older_schemas_keeps_every_row(tmp_path, version):
    shutil.copy(OLD_DBS / f"chats-schema{version}.sqlite3", tmp_path / "chats.sqlite3")
    old = sqlite3.connect(tmp_path / "chats.sqlite3")
    assert old.execute("PRAGMA user_version").fetchone()[0] == version
    cols = {r[1] for r in old.execute("PRAGMA table_info(messages)")}
    assert "reasoning" not in cols
    before = old.execute("SELECT id, role, text, state, stats FROM messages ORDER BY id").fetchall()
    old.close()

    store = Store(tmp_path)
    assert store.schema_version == SCHEMA_VERSION == 3
    convs = store.conversations()
    assert sorted(c.title for c in convs) == ["Capitals", "Second chat"]
    capitals = next(c.id for c in convs if c.title == "Capitals")
    rows = store.messages(capitals)
    assert [(r.role, r.text) for r in rows] == [
        ("user", "What is the capital of France?"),
        ("assistant", "Paris."),
    ]
    assert rows[1].stats["token_ids"] == [1, 2, 3] and rows[1].reasoning is None
    assert store.thinking(capitals) is None
    # the new columns work
    mid = store.add_message(capitals, "assistant", "", state="streaming", reasoning="")
    store.update_message(mid, "Lyon.", "done", {}, reasoning="Think of France.")
    store.set_thinking(capitals, "off")
    store.close()
    again = Store(tmp_path)  # a second open changes nothing
    assert again.schema_version == 3
    assert again.messages(capitals)[-1].reasoning == "Think of France."
    assert again.thinking(capitals) == "off"
    db = again._db
    after = db.execute(
        "SELECT id, role, text, state, stats FROM messages WHERE id < ? ORDER BY id", (mid,)
    ).fetchall()
    assert after == before  # every old row as it was
    again.close()


def test_a_stored_switch_that_is_not_ours_reads_as_the_default(tmp_path):
    store = Store(tmp_path)
    cid = store.create_conversation("x")
    store._db.execute("UPDATE conversations SET thinking = 'maybe' WHERE id = ?", (cid,))
    assert store.thinking(cid) is None
    store.close()


# ---- the reasoning block, fed by a fake engine stream ----------------------------------------


def _fake_engine(window) -> list:
    """Answers go to a list instead of the engine (the test sends the events)."""
    jobs = []
    window.controller.conversation.engine.generate = jobs.append
    return jobs


def _feed(window, job, events) -> None:
    for event in events:
        window.controller.on_event(job.job_id, event)


def _tokens(text="", reasoning="", n_reasoning=0):
    return Tokens(text, [1], StepProfile(), reasoning, n_reasoning)


def test_reasoning_block_collapsed_expands_and_is_never_copied(qtbot, make_window):
    w = make_window()
    jobs = _fake_engine(w)
    send(qtbot, w, "Why?", wait=False)
    qtbot.waitUntil(lambda: len(jobs) == 1)
    job = jobs[0]
    _feed(w, job, [_tokens(reasoning="First, the sky", n_reasoning=1)])
    w.controller.flush()
    answer = w.chat.messages()[-1]
    block = answer.reasoning
    assert block is not None and not block.expanded and not block.body.isVisibleTo(w)
    assert block.header.text().startswith("Thinking…")
    _feed(w, job, [_tokens(reasoning=" scatters blue light.", n_reasoning=3)])
    _feed(w, job, [_tokens(text="Rayleigh scattering.")])
    _feed(w, job, [Finished("stop_token", generated_tokens=5, reasoning="x")])
    qtbot.waitUntil(lambda: not w.controller.busy and answer.isVisible())
    assert block.header.text().startswith("Thought for") and block.header.text().endswith(" s")
    # click: expanded, the whole reasoning; Space on the focused header: collapsed again
    qtbot.mouseClick(block.header, Qt.LeftButton)
    assert block.expanded and block.body.isVisibleTo(w)
    assert block.body.toPlainText() == "First, the sky scatters blue light."
    block.header.setFocus()
    qtbot.keyClick(block.header, Qt.Key_Space)
    assert not block.expanded and not block.body.isVisibleTo(w)
    # Copy: the answer only
    answer.copy_button.click()
    assert QApplication.clipboard().text() == "Rayleigh scattering."
    # stored apart, and shown again (collapsed) when the chat is reopened
    row = w.store.messages(w.controller.current_id)[-1]
    assert row.text == "Rayleigh scattering."
    assert row.reasoning == "First, the sky scatters blue light."
    assert "thinking_s" in row.stats
    cid = w.controller.current_id
    w.controller.open_conversation(None)
    w.controller.open_conversation(cid)
    qtbot.waitUntil(lambda: len(w.chat.messages()) == 2)
    again = w.chat.messages()[-1].reasoning
    assert again is not None and not again.expanded
    assert again.header.text().startswith("Thought for")
    again.set_expanded(True)
    assert again.body.toPlainText() == row.reasoning


def test_switch_disabled_on_the_demo_model_with_its_reason(qtbot, make_window):
    w = make_window()
    switch = w.thinking_switch
    assert not switch.isEnabled() and not switch.isChecked()
    assert "no thinking mode" in switch.toolTip()


@pytest.fixture
def think_dir(demo_dir, tmp_path):
    return checkpoint_with_template(demo_dir, tmp_path / "thinking-model", THINKING_TEMPLATE)


def test_switch_follows_the_chat_and_reaches_the_engine(qtbot, make_window, think_dir):
    w = make_window(model=str(think_dir))
    switch = w.thinking_switch
    assert switch.isEnabled() and switch.isChecked()
    assert "always thinks" in switch.toolTip()
    jobs = _fake_engine(w)
    qtbot.mouseClick(switch, Qt.LeftButton)  # off, before the chat exists
    assert not switch.isChecked()
    send(qtbot, w, "hi", wait=False)
    qtbot.waitUntil(lambda: len(jobs) == 1)
    assert jobs[0].options.thinking == "off"
    cid = w.controller.current_id
    assert w.store.thinking(cid) == "off"
    _feed(w, jobs[0], [_tokens(text="Hello."), Finished("stop_token")])
    qtbot.waitUntil(lambda: not w.controller.busy)
    w.controller.new_conversation()  # a new chat: the template's default
    qtbot.waitUntil(lambda: switch.isChecked())
    w.controller.open_conversation(cid)  # back: off again
    qtbot.waitUntil(lambda: not switch.isChecked())


def test_a_thinking_checkpoint_answers_with_its_reasoning_apart(qtbot, make_window, think_dir):
    """The real engine: the budget setting closes the block after 4 reasoning tokens. Greedy:
    a sampled answer may itself hold a `</think>` (text after the block is answer, as
    written), which would make the assertions below depend on the draw."""
    w = make_window(model=str(think_dir), max_new_tokens=16, thinking_budget=4, temperature=0.0)
    send(qtbot, w, "Think first.")
    row = w.store.messages(w.controller.current_id)[-1]
    assert row.reasoning and "</think>" not in row.text and "</think>" not in row.reasoning
    assert row.text.strip()  # the budget closed the block: the rest is answer
    widget = w.chat.messages()[-1]
    assert widget.reasoning is not None and widget.text == row.text
    assert widget.reasoning.header.text().startswith("Thought for")
    # the next turn sends the answer back without its reasoning (the template drops it)
    send(qtbot, w, "Again.")
    assert w.store.messages(w.controller.current_id)[-1].state == "done"


def test_the_thinking_budget_setting(qtbot, tmp_path, data_dir):
    from merlin.app.settings import AppSettings, SettingsDialog, load_settings, save_settings

    d = SettingsDialog(AppSettings())
    qtbot.addWidget(d)
    assert d.thinking_budget.value() == 0 and d.thinking_budget.specialValueText() == "no limit"
    d.thinking_budget.setValue(1024)
    s = d.result_settings()
    assert s.thinking_budget == 1024 and s.generation_options().thinking_budget == 1024
    from PySide6.QtCore import QSettings

    qs = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    save_settings(s, qs)
    assert load_settings(qs).thinking_budget == 1024
