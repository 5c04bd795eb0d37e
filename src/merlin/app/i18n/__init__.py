"""Translations: English source strings, Simplified Chinese made by the project.

`tr(text)` translates at run time (context "Merlin"); `N_(text)` marks a string for
extraction that is translated later, where it is shown. `scripts/update_translations.py`
collects both from app/ into merlin_zh_CN.ts and compiles merlin_zh_CN.qm with
pyside6-lrelease. Widgets re-read their texts on QEvent.LanguageChange, so switching the
language in the settings applies at once.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QCoreApplication, QLibraryInfo, QLocale, QTranslator

CONTEXT = "Merlin"
LANGUAGES = {"en": "English", "zh_CN": "简体中文"}
FOLDER = Path(__file__).resolve().parent


def tr(text: str) -> str:
    return QCoreApplication.translate(CONTEXT, text)


def N_(text: str) -> str:  # noqa: N802 (gettext's name)
    return text


def system_language() -> str:
    locale = QLocale.system()
    if locale.language() == QLocale.Language.Chinese:
        return "zh_CN"
    return "en"


def resolve_language(setting: str) -> str:
    """'system' (or anything unknown) -> the system's language among those Merlin has."""
    return setting if setting in LANGUAGES else system_language()


class Translations:
    """The translators installed in the application; switch() replaces them. There is one
    set per application: use `translations()`."""

    def __init__(self):
        self._installed: list[QTranslator] = []
        self.language = "en"

    def switch(self, language: str) -> bool:
        """Install `language` ('en', 'zh_CN'); returns False if its file cannot be loaded."""
        app = QCoreApplication.instance()
        for t in self._installed:
            app.removeTranslator(t)
        self._installed = []
        self.language = "en"
        if language == "en":
            return True
        ours = QTranslator(app)
        if not ours.load(str(FOLDER / f"merlin_{language}.qm")):
            return False
        app.installTranslator(ours)
        self._installed.append(ours)
        qt = QTranslator(app)  # Qt's own dialogs and buttons (OK, Cancel, Open ...)
        if qt.load(
            QLocale(language), "qtbase", "_", QLibraryInfo.path(QLibraryInfo.TranslationsPath)
        ):
            app.installTranslator(qt)
            self._installed.append(qt)
        self.language = language
        return True


_shared: Translations | None = None


def shared_translations() -> Translations:
    """The application's translators (one set, whatever the number of windows)."""
    global _shared
    if _shared is None:
        _shared = Translations()
    return _shared
