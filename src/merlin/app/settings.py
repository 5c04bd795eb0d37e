"""Settings: what they are (AppSettings), where they live (QSettings, an INI file in the data
folder) and the dialog that edits them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QSettings, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from merlin.app.model.jobs import MAP_EXPERTS
from merlin.app.model.paths import data_dir, sessions_dir
from merlin.app.model.perf_stats import format_bytes
from merlin.app.model.prompting import SPEC_MODES, GenerationOptions
from merlin.app.widgets.preset_picker import PresetPicker
from merlin.engine.formats import DEFAULT_KV, DEFAULT_WEIGHTS, KV_FORMATS, WEIGHT_CHOICES
from merlin.engine.speculative import MAX_K

from .i18n import LANGUAGES, tr


@dataclass
class AppSettings:
    # generation
    system_prompt: str = ""
    use_model_sampling: bool = True  # the checkpoint's generation_config.json
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 1024
    context_budget: int = 8192
    threads: int = 0  # 0 = one per CPU in use
    cpus: str = "big"  # "big" (big cores of a big.LITTLE CPU), "all" or a list like "0-3"
    spec_mode: str = "auto"
    spec_k: int = 4
    image_max_pixels: int = 0  # 0 = the checkpoint's own limit (used when image_tokens is 0)
    image_tokens: int = 0  # image-token budget per image; 0 = this machine's default
    thinking_budget: int = 0  # reasoning tokens before a thinking model answers; 0: no limit
    # app
    session_cap_mb: int = 4096  # disk for saved sessions (KV caches of chats); 0 = none saved
    language: str = "system"  # "system", "en", "zh_CN"
    model_source: str = ""  # "" = demo; "random-2b"; "remote"; or a folder
    remote_url: str = ""  # the OpenAI-compatible server (its key: app/remote.py, a file)
    remote_model: str = ""
    weights: str = DEFAULT_WEIGHTS
    kv: str = DEFAULT_KV
    map_experts: str = "auto"  # MAP_EXPERTS: MoE experts memory-mapped (at the next load)
    recent_folders: str = ""  # newline-separated
    panel_visible: bool = True
    demo_mode: bool = False
    last_conversation: int = 0
    serve_port: int = 8080  # Model > Serve to other apps

    def generation_options(self) -> GenerationOptions:
        return GenerationOptions(
            system_prompt=self.system_prompt,
            sampling=None
            if self.use_model_sampling
            else {
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "min_p": self.min_p,
                "repetition_penalty": self.repetition_penalty,
            },
            max_new_tokens=self.max_new_tokens,
            context_budget=self.context_budget,
            threads=self.threads,
            spec_mode=self.spec_mode,
            spec_k=self.spec_k,
            max_pixels=self.image_max_pixels,
            image_tokens=self.image_tokens,
            thinking_budget=self.thinking_budget,
        )


def settings_file() -> QSettings:
    return QSettings(str(data_dir() / "settings.ini"), QSettings.IniFormat)


# what the last load_settings() found out of range (shown once by the window)
PROBLEMS: list[str] = []


def load_settings(qs: QSettings | None = None) -> AppSettings:
    from merlin.app.model.settings_check import bounded

    qs = qs or settings_file()
    source = qs.fileName() or "the settings"
    PROBLEMS.clear()
    s = AppSettings()
    for f in dataclasses.fields(AppSettings):
        if not qs.contains(f.name):
            continue
        raw = qs.value(f.name)
        default = getattr(s, f.name)
        try:
            if isinstance(default, bool):
                value = raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1", "yes")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            else:
                value = str(raw)
        except (TypeError, ValueError, OverflowError):
            continue  # a hand-edited or damaged value: keep the default
        value, problem = bounded(f.name, value, default, source)
        if problem:
            PROBLEMS.append(problem)
        setattr(s, f.name, value)
    if s.spec_mode not in SPEC_MODES:
        s.spec_mode = "auto"
    if s.weights not in WEIGHT_CHOICES:
        s.weights = DEFAULT_WEIGHTS
    if s.kv not in KV_FORMATS:
        s.kv = DEFAULT_KV
    if s.map_experts not in MAP_EXPERTS:
        s.map_experts = "auto"
    if not valid_cpus(s.cpus):
        if s.cpus.strip():
            PROBLEMS.append(f"cpus in {source} is not a CPU list; 'big' is used instead.")
        s.cpus = "big"
    return s


def valid_cpus(text: str) -> bool:
    """ "big", "all" or a CPU list such as "0-3,6" (engine.cpu applies it at start)."""
    from merlin.engine.cpu import CPU_MODES, parse_cpu_list
    from merlin.engine.errors import InputError

    if text.strip().lower() in CPU_MODES:
        return True
    try:
        parse_cpu_list(text)
    except InputError:
        return False
    return True


def save_settings(
    s: AppSettings, qs: QSettings | None = None, since: AppSettings | None = None
) -> str:
    """Write the settings; "" when written, else why not (a sentence for the window's notice:
    QSettings itself never raises). since: the values this process last read or wrote; only
    fields changed from them are written, so closing one Merlin never puts back its stale copy
    of what another Merlin saved meanwhile (a system prompt written in the other window)."""
    qs = qs or settings_file()
    for f in dataclasses.fields(AppSettings):
        value = getattr(s, f.name)
        if since is None or value != getattr(since, f.name):
            qs.setValue(f.name, value)
    qs.sync()
    if qs.status() == QSettings.Status.NoError:
        return ""
    return (
        f"The settings could not be saved to {qs.fileName()} (it cannot be written); they "
        "apply until Merlin closes. Check that file and its folder."
    )


class SettingsDialog(QDialog):
    """Edits a copy of the settings; `result_settings()` after exec() == Accepted."""

    def __init__(self, settings: AppSettings, parent=None):
        super().__init__(parent)
        self._base = settings
        layout = QVBoxLayout(self)
        # the settings scroll, the buttons stay: the whole dialog is taller than a 720-line
        # screen (the board's HDMI), which had put OK and Cancel below its edge
        self.content = QWidget()
        fields = QVBoxLayout(self.content)
        fields.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.NoFrame)
        gen = QGroupBox()
        self.gen_box = gen
        form = QFormLayout(gen)
        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setMaximumHeight(90)
        self.use_model = QCheckBox()
        self.use_model.setChecked(settings.use_model_sampling)
        self.temperature = _dspin(0.0, 2.0, 0.05, settings.temperature)
        self.top_p = _dspin(0.01, 1.0, 0.05, settings.top_p)
        self.top_k = _ispin(0, 1000, settings.top_k)
        self.min_p = _dspin(0.0, 0.99, 0.01, settings.min_p)
        self.rep = _dspin(0.5, 2.0, 0.05, settings.repetition_penalty)
        self.max_new = _ispin(1, 32768, settings.max_new_tokens)
        self.context = _ispin(0, 262144, settings.context_budget, step=1024)
        self.threads = _ispin(0, 256, settings.threads)
        self.spec_mode = QComboBox()
        for m in SPEC_MODES:
            self.spec_mode.addItem(m, m)
        self.spec_mode.setCurrentIndex(SPEC_MODES.index(settings.spec_mode))
        self.spec_k = _ispin(1, MAX_K, settings.spec_k)
        self.max_pixels = _ispin(0, 16_777_216, settings.image_max_pixels, step=65536)
        self.image_tokens = _ispin(0, 16384, settings.image_tokens, step=256)
        self.thinking_budget = _ispin(0, 1_000_000, settings.thinking_budget, step=256)
        self.image_tokens_note = QLabel()
        self.image_tokens_note.setWordWrap(True)
        self.image_tokens.valueChanged.connect(self._check_image_tokens)
        self.context.valueChanged.connect(self._check_image_tokens)
        self.language = QComboBox()
        self.language.addItem("", "system")
        for code, name in LANGUAGES.items():
            self.language.addItem(name, code)
        idx = self.language.findData(settings.language)
        self.language.setCurrentIndex(max(0, idx))
        self.labels: dict[str, QLabel] = {}
        self.preset = PresetPicker(self.system_prompt)
        rows = (
            ("preset", self.preset),
            ("system_prompt", self.system_prompt),
            ("use_model", self.use_model),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("top_k", self.top_k),
            ("min_p", self.min_p),
            ("rep", self.rep),
            ("max_new", self.max_new),
            ("context", self.context),
            ("threads", self.threads),
            ("spec_mode", self.spec_mode),
            ("spec_k", self.spec_k),
            ("thinking_budget", self.thinking_budget),
            ("image_tokens", self.image_tokens),
            ("max_pixels", self.max_pixels),
        )
        for key, widget in rows:
            label = QLabel()
            self.labels[key] = label
            form.addRow(label, widget)
            if key == "image_tokens":
                form.addRow(self.image_tokens_note)
        fields.addWidget(gen)
        app_box = QGroupBox()
        self.app_box = app_box
        app_form = QFormLayout(app_box)
        self.labels["language"] = QLabel()
        app_form.addRow(self.labels["language"], self.language)
        self.cpus = QComboBox()
        self.cpus.setEditable(True)  # or a list such as 0-3
        self.cpus.addItems(["big", "all"])
        self.cpus.setCurrentText(settings.cpus)
        self.labels["cpus"] = QLabel()
        app_form.addRow(self.labels["cpus"], self.cpus)
        self.map_experts = QComboBox()
        for choice in MAP_EXPERTS:
            self.map_experts.addItem(choice, choice)
        self.map_experts.setCurrentIndex(max(0, self.map_experts.findData(settings.map_experts)))
        self.labels["map_experts"] = QLabel()
        self.labels["map_experts"].setWordWrap(True)  # a long label, also in Chinese
        app_form.addRow(self.labels["map_experts"], self.map_experts)
        self.session_cap = _ispin(0, 1_048_576, settings.session_cap_mb, step=256)
        self.labels["session_cap"] = QLabel()
        app_form.addRow(self.labels["session_cap"], self.session_cap)
        self.session_usage = QLabel()
        self.session_usage.setWordWrap(True)
        self.session_usage.setTextInteractionFlags(Qt.TextSelectableByMouse)
        app_form.addRow(self.session_usage)
        fields.addWidget(app_box)
        self.scroll.setWidget(self.content)
        layout.addWidget(self.scroll)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.Ok | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(self._defaults)
        layout.addWidget(self.buttons)
        self.use_model.toggled.connect(self._sync_enabled)
        self.spec_mode.currentIndexChanged.connect(self._sync_enabled)
        self._sync_enabled()
        self.retranslate()

    def _image_tokens_value(self) -> tuple[int, str]:
        """(the budget to keep, a message when the one typed is not valid: the nearest)."""
        from merlin.engine.vision.budget import InvalidBudget, check_budget
        from merlin.engine.vision.preprocess import PreprocessConfig

        value = self.image_tokens.value()
        if value == 0:
            return 0, ""
        context = self.context.value() or None
        try:
            return check_budget(value, PreprocessConfig(), context), ""
        except InvalidBudget as e:
            return e.nearest, tr("{why} Kept: {n}.").format(why=e, n=e.nearest)

    def _check_image_tokens(self, *_):
        _, note = self._image_tokens_value()
        self.image_tokens_note.setText(note)
        self.image_tokens_note.setVisible(bool(note))

    def _sync_enabled(self, *_):
        custom = not self.use_model.isChecked()
        for w in (self.temperature, self.top_p, self.top_k, self.min_p, self.rep):
            w.setEnabled(custom)
        self.spec_k.setEnabled(self.spec_mode.currentData() != "off")

    def _defaults(self) -> None:
        d = AppSettings()
        self.system_prompt.setPlainText(d.system_prompt)
        self.use_model.setChecked(d.use_model_sampling)
        self.temperature.setValue(d.temperature)
        self.top_p.setValue(d.top_p)
        self.top_k.setValue(d.top_k)
        self.min_p.setValue(d.min_p)
        self.rep.setValue(d.repetition_penalty)
        self.max_new.setValue(d.max_new_tokens)
        self.context.setValue(d.context_budget)
        self.threads.setValue(d.threads)
        self.cpus.setCurrentText(d.cpus)
        self.map_experts.setCurrentIndex(self.map_experts.findData(d.map_experts))
        self.spec_mode.setCurrentIndex(SPEC_MODES.index(d.spec_mode))
        self.spec_k.setValue(d.spec_k)
        self.thinking_budget.setValue(d.thinking_budget)
        self.max_pixels.setValue(d.image_max_pixels)
        self.image_tokens.setValue(d.image_tokens)
        self.session_cap.setValue(d.session_cap_mb)

    def result_settings(self) -> AppSettings:
        return dataclasses.replace(
            self._base,
            system_prompt=self.system_prompt.toPlainText(),
            use_model_sampling=self.use_model.isChecked(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repetition_penalty=self.rep.value(),
            max_new_tokens=self.max_new.value(),
            context_budget=self.context.value(),
            threads=self.threads.value(),
            spec_mode=self.spec_mode.currentData(),
            spec_k=self.spec_k.value(),
            thinking_budget=self.thinking_budget.value(),
            image_max_pixels=self.max_pixels.value(),
            image_tokens=self._image_tokens_value()[0],
            session_cap_mb=self.session_cap.value(),
            language=self.language.currentData(),
            map_experts=self.map_experts.currentData(),
            cpus=self.cpus.currentText().strip()
            if valid_cpus(self.cpus.currentText())
            else self._base.cpus,
        )

    def showEvent(self, event):  # noqa: N802
        self.fit_screen()
        super().showEvent(event)

    def fit_screen(self) -> None:
        """As tall as the settings when the screen has room, else the screen's height (the
        rest scrolls); as wide as they need."""
        screen = self.screen().availableGeometry() if self.screen() else None
        content = self.content.sizeHint()
        bar = self.scroll.verticalScrollBar().sizeHint().width()
        margins = self.layout().contentsMargins()
        width = content.width() + bar + margins.left() + margins.right()
        height = (content.height() + self.buttons.sizeHint().height() + self.layout().spacing()
                  + margins.top() + margins.bottom())  # fmt: skip
        if screen is not None:
            width, height = min(width, screen.width()), min(height, screen.height() - 40)
        room = width - margins.left() - margins.right()
        self.scroll.setMinimumWidth(min(content.width() + bar, room))
        self.resize(width, height)

    def retranslate(self) -> None:
        self.setWindowTitle(tr("Settings"))
        self.gen_box.setTitle(tr("Answers"))
        self.app_box.setTitle(tr("Application"))
        text = {
            "preset": tr("Preset"),
            "system_prompt": tr("System prompt"),
            "use_model": tr("Sampling"),
            "temperature": tr("Temperature (0 = greedy)"),
            "top_p": tr("Top-p"),
            "top_k": tr("Top-k (0 = off)"),
            "min_p": tr("Min-p"),
            "rep": tr("Repetition penalty"),
            "max_new": tr("Max new tokens"),
            "context": tr("Context budget (tokens, 0 = model maximum)"),
            "threads": tr("Threads (0 = all cores)"),
            "spec_mode": tr("Speculative decoding"),
            "spec_k": tr("Draft tokens K"),
            "thinking_budget": tr("Thinking budget (reasoning tokens, 0 = no limit)"),
            "max_pixels": tr("Image max pixels (0 = model default; used when image tokens is 0)"),
            "image_tokens": tr("Image tokens per image (0 = this machine's default)"),
            "language": tr("Language"),
            "cpus": tr("CPUs: big, all or a list like 0-3 (at the next start)"),
            "session_cap": tr("Disk for saved sessions (MB, 0 = do not save)"),
            "map_experts": tr(
                "Mixture-of-experts weights: keep the experts memory-mapped from the weight "
                "cache (at the next model load)"
            ),
        }
        for key, label in self.labels.items():
            label.setText(text[key])
        self.use_model.setText(tr("Use the model's recommended values"))
        self.session_usage.setText(session_usage_text())
        from merlin.engine.vision.budget import default_tokens

        self.image_tokens.setSpecialValueText(
            tr("this machine's default ({n})").format(n=default_tokens())
        )
        self._check_image_tokens()
        self.thinking_budget.setSpecialValueText(tr("no limit"))
        self.thinking_budget.setToolTip(
            tr(
                "For thinking models: after this many reasoning tokens Merlin closes the "
                "thinking block and the model answers."
            )
        )
        self.language.setItemText(0, tr("System language"))
        choices = {
            "auto": tr("Auto (only when the model would not fit in memory)"),
            "always": tr("Always"),
            "never": tr("Never"),
        }
        for i, choice in enumerate(MAP_EXPERTS):
            self.map_experts.setItemText(i, choices[choice])
        self.map_experts.setToolTip(
            tr(
                "For mixture-of-experts models (such as Qwen3-30B-A3B) with q8 or q4 weights. "
                "Memory-mapped experts stay in the converted weights on disk and are read as "
                "tokens need them, so a model larger than the memory still runs, slower on a "
                "slow disk.\n"
                "Auto: mapped only when the model would not fit in the memory available "
                "otherwise.\n"
                "Always: mapped at every load; the least memory in use.\n"
                "Never: always copied into memory; a model that does not fit is refused.\n"
                "Applies at the next model load."
            )
        )
        for i, m in enumerate(SPEC_MODES):
            self.spec_mode.setItemText(i, {"off": tr("off"), "on": tr("on"), "auto": tr("auto")}[m])

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)


def session_usage_text() -> str:
    """How much disk the saved sessions use now (they let chats continue without
    recomputing; the oldest are deleted first when the limit is reached)."""
    from merlin.engine.session import SessionStore

    usage = SessionStore(sessions_dir()).usage()
    return tr("Saved sessions use {size} in {n} file(s) ({folder}).").format(
        size=format_bytes(usage.bytes), n=usage.files, folder=usage.folder
    )


def _dspin(lo: float, hi: float, step: float, value: float) -> QDoubleSpinBox:
    w = QDoubleSpinBox()
    w.setRange(lo, hi)
    w.setSingleStep(step)
    w.setDecimals(2)
    w.setValue(value)
    return w


def _ispin(lo: int, hi: int, value: int, step: int = 1) -> QSpinBox:
    w = QSpinBox()
    w.setRange(lo, hi)
    w.setSingleStep(step)
    w.setValue(value)
    return w
