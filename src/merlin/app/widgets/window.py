"""The main window: conversation list | chat (banners, messages, composer) | performance panel.

Wiring only: the conversation flow lives in app.model.conversation (bound by app.controller),
each part in its own module. About 600 lines on purpose: it is the one place where the parts
meet (the menus, shortcuts, banners, model bar, splitter and panel toggles that connect
them), so that no part module has to know another.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import re

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QFont, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from merlin.app import pyside_fixes
from merlin.app.controller import ChatController
from merlin.app.i18n import N_, Translations, resolve_language, shared_translations, tr
from merlin.app.model.draft import Draft, DraftImage, DraftKeeper
from merlin.app.model.paths import data_dir
from merlin.app.model.perf_stats import PerfStats, format_bytes
from merlin.app.model.remote import REMOTE_SOURCE
from merlin.app.model.store import ImageRef, Store, StoreError
from merlin.app.remote_settings import remember_remote, remote_config, remote_panel_text
from merlin.app.settings import AppSettings, SettingsDialog, load_settings, save_settings
from merlin.app.widgets import chat_files, startup_problems
from merlin.app.widgets.attachments import clear_scratch
from merlin.app.widgets.banner import Banner
from merlin.app.widgets.chat_view import ChatView
from merlin.app.widgets.composer import MAX_IMAGES, Composer
from merlin.app.widgets.conversations import ConversationList
from merlin.app.widgets.icons import app_icon, icon
from merlin.app.widgets.model_dialog import ModelChoice, ModelDialog
from merlin.app.widgets.perf_panel import PerfPanel
from merlin.app.widgets.serve_dialog import show_serving, toggle_serving
from merlin.app.widgets.thinking_switch import ThinkingSwitch
from merlin.app.worker import SOURCE_DEMO, SOURCE_RANDOM_2B, ModelInfo

pyside_fixes.install()

DEMO_FONT_SCALE = 1.45
DRAFT_SAVE_MS = 1000  # the unsent message is written this long after its last change
CLOSE_READ_WAIT_S = 3.0  # closing waits this long for pictures still being read (the draft)
log = logging.getLogger(__name__)

_PHASES = (
    N_("finding the checkpoint"),
    N_("waiting for the engine"),
    N_("building the 2B-shaped random checkpoint (first time only)"),
    N_("saving the converted weights for the next start"),
    N_("reading the vision encoder"),
    N_("compiling kernels (first start only)"),
    N_("compiling the vision kernels (first start only)"),
    N_("ready"),
)
_LAYER = re.compile(r"^(reading|quantizing) layer (\d+)/(\d+)$")
_EMBED = re.compile(r"^(reading|quantizing) embeddings$")


def model_name(info: ModelInfo) -> str:
    folder = info.folder.rstrip("/").rsplit("/", 1)[-1]
    if info.demo_model:
        return tr("Merlin demo (shapes)")
    if folder.startswith("qwen3vl-demo-"):
        return tr("Merlin demo (random weights)")
    if info.source == SOURCE_RANDOM_2B or folder.startswith("qwen3vl-2b-random-"):
        return tr("Qwen3-VL-2B shapes (random weights)")
    return info.name


def translate_phase(phase: str) -> str:
    m = _LAYER.match(phase)
    if m:
        text = (
            tr("reading layer {i}/{n}")
            if m.group(1) == "reading"
            else tr("quantizing layer {i}/{n}")
        )
        return text.format(i=m.group(2), n=m.group(3))
    m = _EMBED.match(phase)
    if m:
        return tr("reading embeddings") if m.group(1) == "reading" else tr("quantizing embeddings")
    return tr(phase) if phase in _PHASES else phase


class MainWindow(QMainWindow):
    """sig_model_ready(): a model load ended (loaded, failed or cancelled)."""

    sig_model_ready = Signal()

    def __init__(
        self,
        model_folder: str | None = None,
        weights: str | None = None,
        kv: str | None = None,
        settings: AppSettings | None = None,
        translations: Translations | None = None,
    ):
        super().__init__()
        self._closed = False  # closeEvent ran: the store is closed, nothing may read it
        self.file_job = None  # the running chat import or export (widgets/chat_files.py)
        self._chosen = None  # (source, weights, kv, remote) of a load chosen here, until it loads
        self.settings = settings or load_settings()
        self._settings_read = dataclasses.replace(self.settings)  # what save_settings compares
        self.translations = translations or shared_translations()
        self._base_font = QFont(QApplication.font())
        self.setWindowIcon(app_icon())
        self.resize(1280, 720)
        self.setAcceptDrops(True)
        clear_scratch()

        store_error = None  # robust: hook
        try:
            self.store = Store(data_dir())
            store_problem = ""
        except StoreError as e:
            self.store = Store(None)
            store_problem, store_error = str(e), e  # robust: hook

        self.stats = PerfStats()
        self.conversations = ConversationList()
        self.chat = ChatView()
        self.composer = Composer()
        # the unsent text and pictures on disk (model/draft.py): a second after the last
        # change, and at close
        self._draft_timer = QTimer(self, singleShot=True, interval=DRAFT_SAVE_MS)
        self._draft_timer.timeout.connect(self.save_draft)
        self._restoring: dict[str, DraftImage] = {}  # path -> the draft's entry (_restore_draft)
        self._drafts = None  # this window's draft file (none for a store in memory)
        self._draft_problem = ""  # why the last draft save failed (shown once)
        self.composer.sig_contents_changed.connect(self._draft_timer.start)
        self.panel = PerfPanel(self.stats)
        self.load_banner = Banner("info")
        self.model_banner = Banner("warning")
        self.notice_banner = Banner("error")

        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(4)
        cl.addLayout(self._model_bar())
        for b in (self.load_banner, self.model_banner, self.notice_banner):
            wrap = QHBoxLayout()
            wrap.setContentsMargins(8, 0, 8, 0)
            wrap.addWidget(b)
            cl.addLayout(wrap)
        cl.addWidget(self.chat, 1)
        cl.addWidget(self.composer)

        self.splitter = QSplitter(Qt.Horizontal)
        self.splitter.addWidget(self.conversations)
        self.splitter.addWidget(center)
        self.splitter.addWidget(self.panel)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setChildrenCollapsible(False)
        self.setCentralWidget(self.splitter)

        self.controller = ChatController(
            self.store, self.settings, self.chat, self.composer, self.stats, self
        )
        self.controller.ask = self.ask
        c = self.controller
        self.thinking_switch.bind(c)
        c.sig_model_ready.connect(self._load_ended)
        c.sig_model_ready.connect(self.sig_model_ready)
        c.sig_model_changed.connect(self.on_model_changed)
        c.sig_load_progress.connect(self.on_load_progress)
        c.sig_load_failed.connect(self.on_load_failed)
        c.sig_conversations_changed.connect(self.refresh_conversations)
        c.sig_notice.connect(self.on_notice)
        c.sig_serving.connect(lambda status: show_serving(self, status))
        c.sig_busy_changed.connect(self.on_busy_changed)
        c.images.sig_encoder.connect(self.panel.set_encoder)  # the encoder's progress
        self.conversations.sig_selected.connect(c.open_conversation)
        self.conversations.sig_new_requested.connect(self.new_chat)
        self.conversations.sig_rename_requested.connect(c.rename_conversation)
        self.conversations.sig_delete_requested.connect(self.delete_conversation)
        self.conversations.sig_search_changed.connect(lambda _: self.refresh_conversations())
        self.load_banner.sig_action.connect(c.cancel_load)
        self.model_banner.sig_action.connect(self.choose_model)

        self._make_actions()
        self.apply_language(self.settings.language)
        self.set_panel_visible(self.settings.panel_visible)
        self.set_demo_mode(self.settings.demo_mode)
        self.composer.set_busy(False)
        self.panel.set_model("")

        if store_problem:
            self.on_notice("error", tr("Chats will not be saved: {why}").format(why=store_problem))
        elif self.store.interrupted:
            self.on_notice(
                "info",
                tr("Merlin was closed while answering; the partial answer was kept."),
            )
        startup_problems.show(self, store_error)  # robust: hook
        self.refresh_conversations()
        last = self.settings.last_conversation
        if last and self.store.conversation(last) is not None:
            try:
                c.open_conversation(last)
            except Exception:  # the window must open: a chat it cannot show is not reopened
                log.exception("the last chat (%d) could not be shown", last)
                self.settings.last_conversation = 0
                c.open_conversation(None)
                self.on_notice(
                    "error", tr("The chat open last time could not be shown; it is in the list.")
                )
            else:
                self.conversations.select(last)

        self.keep_drafts()
        source = model_folder if model_folder is not None else self.settings.model_source
        c.load_model(
            source or SOURCE_DEMO,
            weights or self.settings.weights,
            kv or self.settings.kv,
            remote=remote_config(self.settings) if source == REMOTE_SOURCE else None,
        )
        QTimer.singleShot(0, self.composer.edit.setFocus)

    # ---- building ------------------------------------------------------------------------

    def _model_bar(self) -> QHBoxLayout:
        bar = QHBoxLayout()
        bar.setContentsMargins(10, 6, 8, 0)
        self.model_label = QLabel()
        self.model_label.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.model_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.model_button = self._tool("model", self.choose_model)
        self.settings_button = self._tool("settings", self.open_settings)
        self.panel_button = self._tool(
            "panel", lambda: self.set_panel_visible(not self.panel.isVisible())
        )
        self.panel_button.setCheckable(True)
        self.thinking_switch = ThinkingSwitch()  # the chat's (thinking models)
        bar.addWidget(self.model_label, 1)
        bar.addWidget(self.thinking_switch)
        bar.addWidget(self.model_button)
        bar.addWidget(self.settings_button)
        bar.addWidget(self.panel_button)
        return bar

    def _tool(self, name: str, slot) -> QToolButton:
        b = QToolButton()
        b.setIcon(icon(name))
        b.setIconSize(QSize(20, 20))
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def _make_actions(self) -> None:
        def action(shortcut, slot, checkable=False):
            a = QAction(self)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            a.setCheckable(checkable)
            a.triggered.connect(slot)
            return a

        self.act_new = action("Ctrl+N", self.new_chat)
        self.act_attach = action("Ctrl+O", self.composer.choose_files)
        self.act_quit = action("Ctrl+Q", self.close)
        self.act_model = action("Ctrl+L", self.choose_model)
        self.act_settings = action("Ctrl+,", self.open_settings)
        self.act_panel = action("F9", lambda on: self.set_panel_visible(on), checkable=True)
        self.act_demo = action("F10", lambda on: self.set_demo_mode(on), checkable=True)
        self.act_full = action("F11", self.toggle_fullscreen, checkable=True)
        self.act_about = action("", self.about)
        self.act_shortcuts = action("F1", self.show_shortcuts)
        self.act_export = action("Ctrl+E", lambda: chat_files.export_chat(self))
        self.act_export_all = action("Ctrl+Shift+E", lambda: chat_files.export_all(self))
        self.act_import = action("Ctrl+I", lambda: chat_files.import_chats(self))
        self.act_copy_md = action("Ctrl+Shift+C", lambda: chat_files.copy_markdown(self))
        # the "< 2/3 >" switch of the focused message, else of the last one with versions
        self.act_prev_version = action("Alt+Left", lambda: self.chat.step_version(-1))
        self.act_next_version = action("Alt+Right", lambda: self.chat.step_version(+1))
        self.act_serve = action("Ctrl+Shift+S", lambda on: toggle_serving(self, on), True)
        mb = self.menuBar()
        self.menu_chat = mb.addMenu("")
        self.menu_chat.addActions([self.act_new, self.act_attach])
        self.menu_chat.addSeparator()
        self.menu_chat.addActions(
            [self.act_export, self.act_export_all, self.act_import, self.act_copy_md]
        )
        self.menu_chat.addSeparator()
        self.menu_chat.addActions([self.act_prev_version, self.act_next_version])
        self.menu_chat.addSeparator()
        self.menu_chat.addAction(self.act_quit)
        self.menu_model = mb.addMenu("")
        self.menu_model.addActions([self.act_model, self.act_settings, self.act_serve])
        self.menu_view = mb.addMenu("")
        self.menu_view.addActions([self.act_panel, self.act_demo, self.act_full])
        self.menu_help = mb.addMenu("")
        self.menu_help.addActions([self.act_shortcuts, self.act_about])

    # ---- language ------------------------------------------------------------------------

    def apply_language(self, setting: str) -> None:
        language = resolve_language(setting)
        if language != self.translations.language:
            self.translations.switch(language)
        self.retranslate()

    def retranslate(self) -> None:
        self.menu_chat.setTitle(tr("&Chat"))
        self.menu_model.setTitle(tr("&Model"))
        self.menu_view.setTitle(tr("&View"))
        self.menu_help.setTitle(tr("&Help"))
        self.act_new.setText(tr("New chat"))
        self.act_attach.setText(tr("Attach images…"))
        self.act_quit.setText(tr("Quit"))
        self.act_model.setText(tr("Load model…"))
        self.act_settings.setText(tr("Settings…"))
        self.act_panel.setText(tr("Performance panel"))
        self.act_demo.setText(tr("Demo mode (large text, big panel)"))
        self.act_full.setText(tr("Full screen"))
        self.act_about.setText(tr("About Merlin"))
        self.act_shortcuts.setText(tr("Keyboard shortcuts"))
        self.act_export.setText(tr("Export chat…"))
        self.act_export_all.setText(tr("Export all chats…"))
        self.act_import.setText(tr("Import chats…"))
        self.act_copy_md.setText(tr("Copy chat as Markdown"))
        self.act_prev_version.setText(tr("Previous version of a message"))
        self.act_next_version.setText(tr("Next version of a message"))
        self.act_serve.setText(tr("Serve to other apps (OpenAI API)…"))
        self.model_button.setToolTip(tr("Load a model (Ctrl+L)"))
        self.settings_button.setToolTip(tr("Settings (Ctrl+,)"))
        self.panel_button.setToolTip(tr("Show or hide the performance panel (F9)"))
        self.load_banner.action.setText(tr("Cancel"))
        self._update_title()
        self._update_model_label()
        if self.controller.model is not None:
            self._update_model_banner(self.controller.model)

    def changeEvent(self, event):  # noqa: N802
        # a closed window (its store closed) still gets the application's language changes
        if event.type() == QEvent.LanguageChange and not self._closed:
            self.retranslate()
        super().changeEvent(event)

    # ---- model ---------------------------------------------------------------------------

    def choose_model(self) -> None:
        s = self.settings
        dialog = ModelDialog(
            ModelChoice(s.model_source or SOURCE_DEMO, s.weights, s.kv, remote_config(s)),
            [f for f in s.recent_folders.split("\n") if f],
            parent=self,
        )
        if dialog.exec() != ModelDialog.Accepted:
            return
        choice = dialog.choice()
        self.load(choice.source, choice.weights, choice.kv, choice.remote)

    def load(self, source: str, weights: str = "f32", kv: str = "f32", remote=None) -> None:
        """Load a model; the settings remember it once it has loaded (a cancelled or failed
        load had become the next start's choice)."""
        self._chosen = (source, weights, kv, remote)
        self.controller.load_model(source, weights, kv, remote=remote)

    def _remember_model(self, info: ModelInfo) -> None:
        """The settings after a model chosen in this window has loaded."""
        if self._chosen is None or info.source != self._chosen[0]:
            return
        source, weights, kv, remote = self._chosen
        self._chosen = None
        s = self.settings
        s.model_source = "" if source == SOURCE_DEMO else source
        if remote is not None:  # an OpenAI-compatible server (app/remote.py)
            remember_remote(s, remote)
        else:
            s.weights, s.kv = weights, kv
        if source not in (SOURCE_DEMO, SOURCE_RANDOM_2B, REMOTE_SOURCE):
            recent = [source] + [f for f in s.recent_folders.split("\n") if f and f != source]
            s.recent_folders = "\n".join(recent[:8])
        self._save_settings()

    def _load_ended(self) -> None:
        """A load ended (loaded, failed or cancelled): its banner goes; with no model at all
        (a first load cancelled) the model banner offers to choose one."""
        c = self.controller
        if c.loading is not None:  # a newer load goes on
            return
        self._chosen = None
        self.load_banner.setVisible(False)
        self._update_model_label()
        if c.model is None and not self.model_banner.isVisible():
            self.model_banner.show_message(
                "info",
                tr("No model is loaded; your messages are kept and answered once one loads."),
                tr("Choose a model…"),
            )

    def on_load_progress(self, fraction: float, phase: str) -> None:
        self.load_banner.show_progress(
            tr("Loading the model: {phase} ({pct:.0f}%)").format(
                phase=translate_phase(phase), pct=fraction * 100
            ),
            fraction,
            tr("Cancel"),
        )
        self._update_model_label()

    def on_model_changed(self, info: ModelInfo) -> None:
        self._remember_model(info)
        if self.controller.loading is None:
            self.load_banner.setVisible(False)
        self._update_model_banner(info)
        self._update_model_label()

    def _update_model_banner(self, info: ModelInfo) -> None:
        if info.demo_model:
            self.model_banner.show_message(
                "info",
                tr(
                    "This is a tiny demo model trained on pictures of shapes: drop a picture "
                    "of shapes and ask about them. Load a Qwen3-VL checkpoint for real answers."
                ),
                tr("Load a model…"),
            )
        elif info.random_weights:
            self.model_banner.show_message(
                "warning",
                tr(
                    "This is a demo model with random weights: its answers are random text. It "
                    "shows how Merlin works and how fast it runs. Load a Qwen3-VL checkpoint for "
                    "real answers."
                ),
                tr("Load a model…"),
            )
        elif not info.vision:
            self.model_banner.show_message(
                "warning",
                tr("Images cannot be used with this model: {why}").format(why=info.vision_problem),
            )
        else:
            self.model_banner.setVisible(False)

    def on_load_failed(self, message: str) -> None:
        self.load_banner.setVisible(False)
        keep = (
            tr("The previous model stays in use.")
            if self.controller.model is not None
            else tr("Choose another model; your messages are kept and answered once one loads.")
        )
        self.model_banner.show_message(
            "error",
            tr("Could not load the model: {why}").format(why=message) + " " + keep,
            tr("Choose a model…"),
        )
        self._update_model_label()

    def _update_model_label(self) -> None:
        c = self.controller
        if c.loading is not None:
            text = tr("Loading…")
        elif c.model is not None:
            text = f"{model_name(c.model)} · {c.model.weights}/{c.model.kv}"
        else:
            text = tr("No model loaded")
        self.model_label.setText(text)
        info = c.model
        # rebuilt on every language switch too (retranslate calls this)
        mapped = info.mapped_expert_bytes if info is not None else 0
        self.panel.set_memory_note(
            tr(
                "The experts are memory-mapped from the weight cache: the parts read from disk "
                "count in this figure, and the system can drop them again when memory is short."
            )
            if mapped
            else ""
        )
        if info is None:
            self.panel.set_model("")
        elif info.source == REMOTE_SOURCE:
            self.panel.set_model(remote_panel_text(info.name, info.folder))
        else:
            text = (
                f"{model_name(info)}\n{tr('weights')} {info.weights} · KV {info.kv} · "
                f"{format_bytes(info.weight_bytes_per_token)} {tr('per token')}"
            )
            if mapped:  # the engine's figure (engine/memory.py)
                text += "\n" + tr("experts {size} memory-mapped from the weight cache").format(
                    size=format_bytes(mapped)
                )
            self.panel.set_model(text)

    # ---- conversations -------------------------------------------------------------------

    def refresh_conversations(self) -> None:
        rows = self.store.conversations(self.conversations.search.text())
        self.conversations.set_conversations(rows, self.controller.current_id)
        self._update_title()

    def new_chat(self) -> None:
        self.controller.new_conversation()
        self.conversations.select(None)
        self.composer.edit.setFocus()

    def delete_conversation(self, conversation_id: int) -> None:
        row = self.store.conversation(conversation_id)
        if row is None:
            return
        if self.ask(
            tr("Delete chat?"),
            tr("Delete “{title}” and its images? This cannot be undone.").format(title=row.title),
        ):
            self.controller.delete_conversation(conversation_id)

    def _update_title(self) -> None:
        cid = self.controller.current_id if hasattr(self, "controller") else None
        row = self.store.conversation(cid) if cid else None
        self.setWindowTitle(f"{row.title} — Merlin" if row else "Merlin")

    # ---- notices -------------------------------------------------------------------------

    def on_notice(self, kind: str, text: str) -> None:
        if kind == "done":  # a notice that no longer applies (controller.sig_notice)
            if self.notice_banner.isVisible() and self.notice_banner.label.text() == text:
                self.notice_banner.setVisible(False)
            return
        self.notice_banner.show_message(kind, text)

    def on_busy_changed(self, busy: bool) -> None:
        if busy and self.notice_banner.kind == "error":  # the last try's error is old news
            self.notice_banner.setVisible(False)

    def ask(self, title: str, text: str) -> bool:
        return (
            QMessageBox.question(self, title, text, QMessageBox.Yes | QMessageBox.No)
            == QMessageBox.Yes
        )

    def about(self) -> None:
        from merlin.engine.version import __version__

        QMessageBox.about(
            self,
            tr("About Merlin"),
            tr("Merlin {version}").format(version=__version__)
            + "\n\n"
            + tr(
                "Merlin chats with Qwen3-VL vision-language models on this computer, with its own "
                "NumPy + Numba engine, and shows where every token's time goes."
            ),
        )

    def shortcut_rows(self) -> list[tuple[str, str]]:
        """(keys, what they do) for every action with a shortcut, then the composer's keys."""
        rows = []
        for menu in (self.menu_chat, self.menu_model, self.menu_view, self.menu_help):
            for a in menu.actions():
                if not a.shortcut().isEmpty():
                    keys = a.shortcut().toString(QKeySequence.NativeText)
                    rows.append((keys, a.text().replace("&", "").rstrip("…")))
        rows += [
            ("Enter", tr("Send the message")),
            ("Shift+Enter", tr("New line in the message")),
            ("Esc", tr("Stop the answer (keeps what it wrote)")),
            ("Ctrl+V", tr("Paste an image or text")),
        ]
        return rows

    def show_shortcuts(self) -> None:
        rows = "".join(
            f"<tr><td><b>{html.escape(k)}</b>&nbsp;&nbsp;</td><td>{html.escape(t)}</td></tr>"
            for k, t in self.shortcut_rows()
        )
        QMessageBox.information(self, tr("Keyboard shortcuts"), f"<table>{rows}</table>")

    # ---- settings and view ---------------------------------------------------------------

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec() != SettingsDialog.Accepted:
            return
        self.apply_settings(dialog.result_settings())

    def apply_settings(self, new: AppSettings) -> None:
        language_changed = new.language != self.settings.language
        if new.session_cap_mb != self.settings.session_cap_mb:
            self.controller.set_session_cap(new.session_cap_mb)
        for name, value in vars(new).items():
            setattr(self.settings, name, value)
        self._save_settings()
        self.stats.spec_mode, self.stats.spec_k = new.spec_mode, new.spec_k
        self.panel.refresh(force=True)
        if language_changed:
            self.apply_language(new.language)
        self.controller.meter.schedule()  # the budget or the language may have changed

    def set_panel_visible(self, on: bool) -> None:
        self.panel.setVisible(on)
        self.panel_button.setChecked(on)
        self.act_panel.setChecked(on)
        self.settings.panel_visible = on
        if on:
            self.panel.refresh(force=True)
            self._size_splitter()

    def set_demo_mode(self, on: bool) -> None:
        self.settings.demo_mode = on
        self.act_demo.setChecked(on)
        font = QFont(self._base_font)
        if on:
            font.setPointSizeF(self._base_font.pointSizeF() * DEMO_FONT_SCALE)
        QApplication.setFont(font)
        self.conversations.setVisible(not on)
        self.panel.set_demo_mode(on)
        if on and not self.panel.isVisible():
            self.set_panel_visible(True)
        self._size_splitter()

    def _size_splitter(self) -> None:
        total = max(self.width(), 800)
        if self.settings.demo_mode:
            sizes = [0, int(total * 0.56), int(total * 0.44)]
        else:
            side = min(280, int(total * 0.2))
            panel = min(400, int(total * 0.28)) if not self.panel.isHidden() else 0
            sizes = [side, total - side - panel, panel]
        self.splitter.setSizes(sizes)

    def toggle_fullscreen(self, on: bool | None = None) -> None:
        on = not self.isFullScreen() if on is None else on
        self.act_full.setChecked(on)
        self.showFullScreen() if on else self.showNormal()

    def resizeEvent(self, event):  # noqa: N802
        super().resizeEvent(event)
        if not getattr(self, "_sized", False) or self.settings.demo_mode:
            self._sized = True
            self._size_splitter()

    # ---- drag and drop anywhere ----------------------------------------------------------

    def dragEnterEvent(self, event):  # noqa: N802
        mime = event.mimeData()
        if mime.hasUrls() or mime.hasImage():
            event.acceptProposedAction()

    def dragMoveEvent(self, event):  # noqa: N802
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event):  # noqa: N802
        self.composer.add_mime(event.mimeData())
        event.acceptProposedAction()
        self.composer.edit.setFocus()

    # ---- closing -------------------------------------------------------------------------

    def _save_settings(self) -> None:
        """The settings this window changed since it read or saved them; a notice if the
        file cannot be written."""
        problem = save_settings(self.settings, since=self._settings_read)
        if problem:
            self.on_notice("error", problem)
        else:
            self._settings_read = dataclasses.replace(self.settings)

    def keep_drafts(self) -> None:
        """Keep the unsent message on disk from now on, and put back in an empty box what
        windows that are gone left: at start, or when a new chat history gives a window that
        started on a store in memory one on disk (a box holding something is left as it is,
        and those drafts wait on disk for the next start)."""
        if self._drafts is not None or not self.store.folder:
            return
        try:
            self._drafts = DraftKeeper(data_dir())
        except OSError as e:
            log.warning("the unsent message will not be kept on disk: %s", e)
            return
        text, attachments, pending = self.composer.draft()
        if Draft(text).empty and not attachments and not pending:
            self._restore_draft()
        else:
            self._draft_timer.start()

    def save_draft(self) -> bool:
        """Keep the unsent text and pictures on disk (not for a store in memory: nothing is
        kept then). Pictures are named by their copy in the store (made when attached).
        False if what the box holds could not be written: a notice says so (once until a
        save works)."""
        self._draft_timer.stop()
        if self._drafts is None:
            return True
        text, attachments, pending = self.composer.draft()
        images = []
        for a in attachments:
            ref = a.stored if isinstance(a.stored, ImageRef) else None
            sha, ext = (ref.sha256, ref.ext) if ref else ("", "")
            images.append(DraftImage(sha, ext, a.name, str(a.path), a.detail))
        for path, name, detail in pending:  # still being read: as the last draft named them
            was = self._restoring.get(path)
            sha, ext = (was.sha256, was.ext) if was else ("", "")
            images.append(DraftImage(sha, ext, name, was.path if was else path, detail))
        draft = Draft(text, images)
        saved = self._drafts.save(draft)
        problem = self._drafts.problem
        if problem and problem != self._draft_problem:
            self.on_notice(
                "error",
                tr(
                    "Your unsent message could not be kept on disk ({why}); it is still in the box."
                ).format(why=problem),
            )
        self._draft_problem = problem
        return saved or draft.empty  # an old file left behind loses nothing written

    def _restore_draft(self) -> None:
        """The drafts of windows that are gone (model/draft.py) back in the box: each picture
        from the store's copy, or from where it came if the store has none."""
        if self._drafts is None:
            return
        draft = self._drafts.take_over(max_images=MAX_IMAGES)
        images = []
        for i in draft.images:
            ref = ImageRef(i.sha256, i.ext, i.name) if i.sha256 else None
            path = self.store.image_path(ref) if ref else None
            path = str(path if path and path.is_file() else i.path)
            self._restoring[path] = i  # named as before while it is read again
            images.append((path, i.name, i.detail))
        self.composer.restore_draft(draft.text, images)

    def closeEvent(self, event):  # noqa: N802
        if self._closed:  # closed once already: all of the below is done
            super().closeEvent(event)
            return
        # a picture still being read is waited for a while; the draft names it either way
        if not self.composer.close_reading(CLOSE_READ_WAIT_S):
            log.warning("closing while pictures are still being read")
        if not self.save_draft() and not self.ask(
            tr("Close Merlin?"),
            tr("Your unsent message could not be kept on disk ({why}). Close and lose it?").format(
                why=self._drafts.problem
            ),
        ):
            event.ignore()  # the box still holds it: the user can copy it somewhere
            return
        self.composer.sig_contents_changed.disconnect(self._draft_timer.start)
        self.composer.drop_readings()  # one that comes later changes nothing
        if self._drafts is not None:
            self._drafts.close()  # the draft stays on disk for the next start
            self._drafts = None
        self._save_settings()  # (a problem saving them is shown while the window is there)
        # then gone from the screen; what follows may wait (an export finishing, the engine
        # thread ending a compilation that cannot be interrupted)
        self.hide()
        if self.file_job is not None:
            self.file_job.wait()  # an export's file complete, an import's chats added
        self.controller.shutdown()
        self.panel.timer.stop()
        self.store.close()
        self._closed = True
        if self.settings.demo_mode:
            QApplication.setFont(self._base_font)
        super().closeEvent(event)

    # ---- for tests and the status of the app ---------------------------------------------

    @property
    def status(self) -> QLabel:
        return self.model_label
