"""When each chat was last used, in the conversation list (app/model/dates.py): today with
its time, yesterday, a weekday within the week, the date before, by calendar day and with a
fixed clock, in English and in Chinese, through the real window's list."""

from __future__ import annotations

from datetime import datetime

from gui_helpers import data_dir, make_window  # noqa: F401 (fixtures)

from merlin.app.model.dates import chat_date

NOW = datetime(2026, 11, 12, 14, 30).timestamp()  # a Thursday


def ts(*args) -> float:
    return datetime(*args).timestamp()


def test_dates_by_calendar_day():
    assert chat_date(ts(2026, 11, 12, 14, 5), NOW) == "Today 14:05"
    assert chat_date(ts(2026, 11, 12, 0, 1), NOW) == "Today 00:01"
    assert chat_date(ts(2026, 11, 12, 15, 0), NOW) == "Today 15:00"  # a clock set back
    assert chat_date(ts(2026, 11, 11, 23, 59), NOW) == "Yesterday"
    assert chat_date(ts(2026, 11, 10, 9, 0), NOW) == "Tue"
    assert chat_date(ts(2026, 11, 6, 9, 0), NOW) == "Fri"  # six days back
    assert chat_date(ts(2026, 11, 5, 9, 0), NOW) == "5 Nov 2026"  # a week back: the date
    assert chat_date(ts(2025, 1, 3, 9, 0), NOW) == "3 Jan 2025"
    midnight = ts(2026, 11, 13, 0, 10)
    assert chat_date(ts(2026, 11, 12, 23, 50), midnight) == "Yesterday"


def _fill(w, times):
    store = w.store
    ids = []
    for i, t in enumerate(times):
        cid = store.create_conversation(f"chat {i}")
        with store._transaction() as db:  # a chat last used then
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (t, cid))
        ids.append(cid)
    w.conversations.clock = lambda: NOW
    w.refresh_conversations()
    return ids


def test_the_list_shows_dates_and_follows_the_language(qtbot, make_window):
    w = make_window()
    _fill(w, [ts(2025, 1, 3, 9, 0), ts(2026, 11, 10, 8, 0), ts(2026, 11, 11, 20, 0),
              ts(2026, 11, 12, 14, 5)])  # fmt: skip
    lst = w.conversations
    assert lst.titles() == ["chat 3", "chat 2", "chat 1", "chat 0"]  # the latest first
    assert lst.dates() == ["Today 14:05", "Yesterday", "Tue", "3 Jan 2025"]
    assert "2026-11-12 14:05" in lst.list.item(0).toolTip()
    # two lines per row: the date has room under the title
    rect = lst.list.visualItemRect(lst.list.item(0))
    assert rect.height() >= 2 * lst.list.fontMetrics().height()
    new = type(w.settings)(**vars(w.settings))
    new.language = "zh_CN"
    w.apply_settings(new)
    qtbot.waitUntil(lambda: lst.dates()[0].startswith("今天"), timeout=5000)
    assert lst.dates() == ["今天 14:05", "昨天", "周二", "2025年1月3日"]
    assert lst.titles() == ["chat 3", "chat 2", "chat 1", "chat 0"]  # no rename happened
    assert [c.title for c in w.store.conversations("")][0] == "chat 3"
