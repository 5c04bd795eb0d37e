"""The composer's context meter: "1,840 / 8,192 tokens", the tokens the model will see if the
draft is sent now, against the context budget.

Runs on the GUI thread and never tokenizes: it builds a CountJob (the stored conversation as
the next turn would send it, then the draft's text and attached pictures with their chosen
budgets) 300 ms after the last keystroke, attachment change, opened chat or finished answer,
and the engine thread counts it (worker.count -> engine/session/counting.py: the session's
own rendering, old turns left out as the turn would leave them, image tokens from
engine/vision/budget.py). Jobs go through a LatestBox (app/model/counting.py), so the worker
counts only the newest; a report for an older serial is ignored. While an answer streams
nothing is sent (the answer's end schedules a count).

Colours: amber above AMBER_FRACTION of the budget, red when the draft cannot fit (with the
engine's reason in the tooltip); hidden without a local model.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QPalette

from merlin.app.i18n import tr
from merlin.app.model.counting import CountJob, CountReport, LatestBox
from merlin.app.model.history import prompt_turns
from merlin.app.model.prompting import Turn
from merlin.app.widgets import theme
from merlin.engine.vision.budget import BudgetedImage

DEBOUNCE_MS = 300


class ContextMeter(QObject):
    """sig_count(object): the LatestBox holding the newest CountJob (connect queued to the
    worker's count). composer: app/widgets/composer.Composer (its `meter` label);
    conversation: app/model/conversation.ConversationModel (the chat, the store, the state)."""

    sig_count = Signal(object)

    def __init__(self, composer, conversation, parent=None):
        super().__init__(parent)
        self.composer = composer
        self.conversation = conversation
        self.box = LatestBox()
        self.serial = 0
        self.requests = 0  # CountJobs sent (tests: typing fast sends few)
        self.last: CountReport | None = None
        self.kv_bytes = lambda n: None  # the engine session's KV bytes (the panel's stats)
        self.timer = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self.timer.timeout.connect(self.send)
        composer.edit.textChanged.connect(self.schedule)
        composer.sig_attached.connect(self.schedule)
        composer.sig_detached.connect(self.schedule)
        composer.sig_detail.connect(self.schedule)

    def schedule(self, *_args) -> None:
        """Count again DEBOUNCE_MS from now (a later call restarts the wait)."""
        self.timer.start()

    def _turns(self) -> list[Turn]:
        m, c = self.conversation, self.composer
        rows = m.store.messages(m.current_id) if m.current_id is not None else []
        if m.editing_id is not None:  # sending replaces that message and what follows
            rows = [r for r in rows if r.id < m.editing_id]
        turns, _missing = prompt_turns(rows, m.store.image_path)
        images = []
        for a in c.attachments():
            tokens = c.image_tokens(a)
            images.append(a.path if tokens is None else BudgetedImage(a.path, tokens))
        return [*turns, Turn("user", c.text(), images)]

    def send(self) -> None:
        m = self.conversation
        if not m.ready:
            self.show(None)
            return
        if m.busy:
            return  # the answer's end schedules a count
        try:
            turns = self._turns()
        except Exception:  # e.g. the store is unreadable: the window says so elsewhere
            return
        self.serial += 1
        self.requests += 1
        options = m.settings.generation_options()
        self.box.put(CountJob(self.serial, turns, options, m.current_id))
        self.sig_count.emit(self.box)

    def on_report(self, report: CountReport) -> None:
        if report.serial != self.serial:
            return  # a newer draft is being counted
        self.last = report
        self.show(report if report.available else None)
        if report.available:
            self.kv_bytes(report.kv_bytes)

    # ---- showing -------------------------------------------------------------------------

    def show(self, r: CountReport | None) -> None:
        label = self.composer.meter
        label.setVisible(r is not None)
        if r is None:
            return
        n = f"{r.tokens:,}" if r.tokens else "?"
        label.setText(tr("{n} / {budget} tokens").format(n=n, budget=f"{r.budget:,}"))
        level = r.level
        pal = label.palette()
        color = {"amber": theme.banner_colors("warning")[1], "red": theme.banner_colors("error")[1]}
        pal.setColor(QPalette.WindowText, color.get(level, theme.muted_text()))
        label.setPalette(pal)
        label.setToolTip(tooltip(r))


def tooltip(r: CountReport) -> str:
    lines = [
        tr(
            "If you send now, the model sees {n} tokens: the conversation in context and your "
            "message. The context budget is {budget} tokens (Settings); {reserve} of them are "
            "kept free for the answer."
        ).format(n=f"{r.tokens:,}", budget=f"{r.budget:,}", reserve=f"{r.reserve:,}")
    ]
    if r.image_tokens:
        lines.append(tr("The attached pictures take {n} tokens.").format(n=f"{r.image_tokens:,}"))
    if r.dropped:
        lines.append(
            tr("{n} older message(s) are left out to make room; they stay in the chat.").format(
                n=r.dropped
            )
        )
    level = r.level
    if level == "amber":
        lines.append(tr("Nearly full: older messages will soon be left out."))
    elif level == "red":
        lines.append(tr("This message cannot be sent as it is: {why}").format(why=r.problem))
    return "\n".join(lines)
