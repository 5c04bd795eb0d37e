"""When a chat was last used, as the conversation list shows it. Qt-free.

    today            "Today 14:05"
    yesterday        "Yesterday"
    within 6 days    "Mon"
    older            "3 Nov 2026"

Local time, compared by calendar day (not 24-hour spans), so a chat of 23:50 is "Yesterday"
at 00:10. A timestamp in the future (a clock set back) counts as today. `tr` is the app's
translation function (merlin.app.i18n.tr); the words and the order of day, month and year
are translated strings (in Chinese: "今天 14:05", "昨天", "周一", "2026年11月3日").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime


def N_(text: str) -> str:  # noqa: N802 (marks a string for translation, like merlin.app.i18n)
    return text


WEEKDAYS = (N_("Mon"), N_("Tue"), N_("Wed"), N_("Thu"), N_("Fri"), N_("Sat"), N_("Sun"))
MONTHS = (
    N_("Jan"), N_("Feb"), N_("Mar"), N_("Apr"), N_("May"), N_("Jun"),
    N_("Jul"), N_("Aug"), N_("Sep"), N_("Oct"), N_("Nov"), N_("Dec"),
)  # fmt: skip


def chat_date(ts: float, now: float | None = None, tr: Callable[[str], str] = N_) -> str:
    """The list's line for a chat last used at `ts` (seconds since the epoch), seen at `now`."""
    when = datetime.fromtimestamp(ts)
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    days = (today - when.date()).days
    if days <= 0:
        return tr("Today {time}").format(time=when.strftime("%H:%M"))
    if days == 1:
        return tr("Yesterday")
    if days < 7:
        return tr(WEEKDAYS[when.weekday()])
    return tr("{day} {month} {year}").format(
        day=when.day, month=tr(MONTHS[when.month - 1]), year=when.year
    )


def full_date(ts: float) -> str:
    """The exact time, for a tooltip: "2026-11-03 14:05"."""
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")
