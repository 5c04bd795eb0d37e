"""Versions of a message in the chat flow: regenerate, edit and switch keep every version. Qt-free.

A mixin of ConversationModel (conversation.py), which owns the state it reads: the chat shown
(current_id), the answer in flight, the edit in progress, the store and the view. The store
keeps the tree (store_tree.py); this part decides what a user action adds or selects and
redraws the messages below the fork that changed:

- regenerate(answer), the last answer or an earlier one: a new answer below the same
  question, shown; the old one stays as a version ("< 1/2 >") with the turns that followed
  it in its branch. The engine session keeps the KV rows of the prefix up to the question.
- an edit of a question (send() while editing_id is set): the new text becomes a sibling of
  the edited question and gets its answer; the old question and everything below it stay.
- switch_version(message, step): shows the previous/next version of a message and, below it,
  the branch it leads to as it was last shown. An answer that is streaming is stopped first
  and kept (as "stopped") in its own branch. The engine session is then prepared with the new
  path: it keeps the KV rows of the prefix the two branches share (engine.session finds the
  longest common prefix), so the next question prefills only what differs.

View port: the message handles get set_versions(version, count) when a message has more than
one version.
"""

from __future__ import annotations

import sqlite3

from merlin.app.model.store import AT_END, MessageRow, StoreError


class Branching:
    """Mixin: the versions of messages, for ConversationModel."""

    def regenerate(self, message_id: int) -> None:
        """Answer the question above answer `message_id` again, as a new version of it."""
        if self.answer is not None or self.current_id is None or not self.ready:
            return
        rows = self.store.messages(self.current_id)
        i = next((k for k, r in enumerate(rows) if r.id == message_id), -1)
        if i < 1 or rows[i].role != "assistant":
            return
        if self.editing_id is not None and self.editing_id > message_id:  # below: it goes
            self.composer.leave_edit()  # (ids grow along a path)
            self.editing_id = None
        self.view.remove_from(message_id)
        self._start_answer(after=rows[i - 1].id)
        if self.answer is None:  # the store failed (its notice is up): the answer back
            self.open_conversation(self.current_id)

    def edit_parent(self):
        """The fork of the message being edited (its parent; None for a first message), or
        AT_END if it is not shown any more (the text is then sent as a new message)."""
        rows = self.store.messages(self.current_id) if self.current_id is not None else []
        row = next((r for r in rows if r.id == self.editing_id), None)
        return row.parent_id if row is not None else AT_END

    def switch_version(self, message_id: int, step: int) -> None:
        """Show the version `step` (-1 previous, +1 next) away from message `message_id`; an
        answer that is streaming is stopped (and kept) first."""
        self.when_idle(lambda: self._switch(message_id, step))

    def _switch(self, message_id: int, step: int) -> None:
        tr = self.tr
        cid = self.current_id
        if cid is None:
            return
        siblings = self.store.versions(message_id)
        if message_id not in siblings:
            return
        j = siblings.index(message_id) + step
        if not 0 <= j < len(siblings) or self.view.message(message_id) is None:
            return
        if self.editing_id is not None:  # the message being edited may leave the view
            self.composer.leave_edit()
            self.editing_id = None
        try:
            self.store.select_version(siblings[j])
        except (sqlite3.Error, StoreError) as e:
            self.notice("error", tr("The chat store failed: {why}").format(why=e))
            return
        self.view.remove_from(message_id)
        rows = self.store.messages(cid)
        shown = [r.id for r in rows]
        start = shown.index(siblings[j]) if siblings[j] in shown else len(rows)
        for r in rows[start:]:
            self._show_row(r)
        self._update_actions()
        self._prepare_session()
        self._answer_waiting()

    def show_versions(self, widget, row: MessageRow | None = None, message_id=None) -> None:
        """Tell a message handle which version it is, when there are several."""
        if widget is None:
            return
        if row is None:
            ids = self.store.versions(message_id)
            version, count = (ids.index(message_id) + 1 if message_id in ids else 1), len(ids)
        else:
            version, count = row.version, row.versions
        if count > 1:
            widget.set_versions(version, count)
