"""What the window says at start about a data folder, chat database or settings it could not
use, and the offer to start a new chat history beside a database that cannot be opened.

Called once from MainWindow.__init__ (one hook line). Nothing on disk is changed unless the
user presses the banner's button; then the unusable database is moved aside unchanged
(Store.start_new_beside) and a new one is opened in its place.
"""

from __future__ import annotations

from merlin.app.i18n import tr
from merlin.app.model import chat_export
from merlin.app.model.paths import data_dir, data_dir_problem
from merlin.app.model.store import Store, StoreError


def show(window, store_error: StoreError | None) -> None:
    """Notices for the data folder and settings; the new-history offer for store_error."""
    from merlin.app import settings as settings_module

    notes = [p for p in (data_dir_problem(), *settings_module.PROBLEMS) if p]
    if store_error is not None and getattr(store_error, "can_start_new", False):
        offer_new_store(window, store_error, notes)
    elif notes:
        why = [tr("Chats will not be saved: {why}").format(why=store_error)] if store_error else []
        window.on_notice("error", " ".join([*notes, *why]))


def offer_new_store(window, error: StoreError, notes=()) -> None:
    banner = window.notice_banner
    text = tr("Chats will not be saved: {why}").format(why=error)
    banner.show_message("error", " ".join([*notes, text]), action=tr("Start a new chat history"))

    def start() -> None:
        c = window.controller
        job = window.file_job
        if c.busy or (job is not None and job.running):  # writing into the store in memory
            text = tr("Stop the answer first, then start a new chat history.")
            if not c.busy:
                text = tr("Wait for the import or export to end, then start a new chat history.")
            banner.show_message("error", text, action=tr("Start a new chat history"))
            return
        banner.sig_action.disconnect(start)
        folder = data_dir()
        try:
            moved = Store.start_new_beside(folder)
            store = Store(folder)
        except (OSError, StoreError) as e:
            window.on_notice(
                "error", tr("A new chat history could not be started: {why}").format(why=e)
            )
            return
        try:  # the chats written since the window opened (in memory) go into the new one
            new_ids = chat_export.copy_conversations(window.store, store)
        except (OSError, StoreError, chat_export.ChatFileError) as e:
            store.close()  # the window stays on the chats in memory; the next start opens it
            window.on_notice(
                "error",
                tr(
                    "The chats written since Merlin started could not be copied into the new "
                    "chat history ({why}); export them to keep them."
                ).format(why=e),
            )
            return
        old, window.store = window.store, store
        c.set_store(store)
        c.open_conversation(new_ids.get(c.current_id) if c.current_id else None)
        for a in window.composer.attachments():  # their copies go with the store in memory
            try:
                a.stored = store.import_image(a.path, a.name)
            except (OSError, StoreError):
                a.stored = None  # sending copies it again (and says what failed)
        old.close()
        window.refresh_conversations()
        window.conversations.select(c.current_id)
        window.keep_drafts()
        window.on_notice(
            "info",
            tr("A new chat history was started. The old file was kept unchanged as {name}.").format(
                name=moved.name
            ),
        )

    banner.sig_action.connect(start)
