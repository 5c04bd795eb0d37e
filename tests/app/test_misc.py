"""Translations, settings, the model finder, prompt building, layering, the screenshot."""

import json
import os
import subprocess
import sys
from pathlib import Path

from gui_helpers import data_dir, make_window  # noqa: F401 (fixtures)
from PySide6.QtCore import QSettings
from PySide6.QtGui import QImage

ROOT = Path(__file__).resolve().parents[2]


def test_translations_are_complete_and_compiled():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "update_translations.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_settings_roundtrip_and_bad_values(tmp_path):
    from merlin.app.settings import AppSettings, load_settings, save_settings

    qs = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    s = AppSettings(
        temperature=0.3,
        top_k=7,
        spec_mode="off",
        system_prompt="Be brief.",
        use_model_sampling=False,
        panel_visible=False,
    )
    save_settings(s, qs)
    back = load_settings(QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    assert back == s
    qs.setValue("top_k", "not a number")
    qs.setValue("spec_mode", "sometimes")
    qs.sync()
    back = load_settings(QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    assert back.top_k == AppSettings().top_k and back.spec_mode == "auto"
    opts = s.generation_options()
    assert opts.sampling["temperature"] == 0.3 and opts.spec_mode == "off"
    assert AppSettings().generation_options().sampling is None  # the checkpoint's defaults


def test_settings_that_cannot_be_written_say_so(tmp_path):
    """A settings.ini that is a folder: save_settings says why (QSettings never raises, and
    the system prompt just written was silently gone at the next start)."""
    from merlin.app.settings import AppSettings, save_settings

    (tmp_path / "s.ini").mkdir()
    problem = save_settings(
        AppSettings(system_prompt="mine"), QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    )
    assert "could not be saved" in problem and "s.ini" in problem
    assert (
        save_settings(AppSettings(), QSettings(str(tmp_path / "t.ini"), QSettings.IniFormat)) == ""
    )


def test_closing_one_merlin_keeps_what_another_saved(tmp_path):
    """Two windows read the settings; A saves a system prompt; B, closing, writes only what B
    changed (its stale copy of the system prompt had replaced A's)."""
    import dataclasses

    from merlin.app.settings import AppSettings, load_settings, save_settings

    def ini():
        return QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)

    save_settings(AppSettings(), ini())
    a, b = load_settings(ini()), load_settings(ini())
    a_read, b_read = dataclasses.replace(a), dataclasses.replace(b)
    a.system_prompt = "My carefully written system prompt"
    assert save_settings(a, ini(), since=a_read) == ""
    b.top_k = 3
    assert save_settings(b, ini(), since=b_read) == ""
    back = load_settings(ini())
    assert back.system_prompt == "My carefully written system prompt" and back.top_k == 3


def test_settings_dialog_edits_a_copy(qtbot):
    from merlin.app.settings import AppSettings, SettingsDialog

    s = AppSettings()
    d = SettingsDialog(s)
    qtbot.addWidget(d)
    d.max_new.setValue(77)
    d.spec_mode.setCurrentIndex(d.spec_mode.findData("on"))
    d.spec_k.setValue(6)
    d.language.setCurrentIndex(d.language.findData("zh_CN"))
    r = d.result_settings()
    assert (r.max_new_tokens, r.spec_mode, r.spec_k, r.language) == (77, "on", 6, "zh_CN")
    assert s.max_new_tokens == AppSettings().max_new_tokens


def test_settings_dialog_fits_a_short_screen(qtbot, monkeypatch):
    """On a 1280x720 screen the dialog (764 px tall in English, 780 in Chinese) had put OK and
    Cancel below the screen's edge: the settings scroll, the buttons stay in view."""
    from PySide6.QtCore import QRect

    from merlin.app.settings import AppSettings, SettingsDialog

    d = SettingsDialog(AppSettings())
    qtbot.addWidget(d)
    monkeypatch.setattr(type(d.screen()), "availableGeometry", lambda self: QRect(0, 0, 1280, 500))
    d.show()
    qtbot.waitExposed(d)
    assert d.height() <= 460
    ok = d.buttons.button(d.buttons.StandardButton.Ok)
    assert ok.isVisible() and d.rect().contains(ok.geometry().translated(d.buttons.pos()))
    assert d.scroll.verticalScrollBar().maximum() > 0  # the rest is one scroll away


def test_hf_cache_scan_finds_the_checkpoints_merlin_runs_only(tmp_path):
    from merlin.app.model.hf_scan import find_checkpoints

    def snapshot(repo, config, weights=True):
        snap = tmp_path / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps(config))
        if weights:
            (snap / "model.safetensors").write_bytes(b"")
            (snap / "tokenizer.json").write_text("{}")
        return snap

    good = snapshot("Qwen/Qwen3-VL-2B-Instruct", {"model_type": "qwen3_vl"})
    snapshot(
        "Qwen/Qwen3-VL-8B-Instruct",
        {"architectures": ["Qwen3VLForConditionalGeneration"]},
        weights=False,
    )
    snapshot("Qwen/Qwen3-30B-A3B", {"model_type": "qwen3_moe"})
    snapshot("other/llama", {"model_type": "llama"})
    (tmp_path / "models--broken" / "snapshots" / "x").mkdir(parents=True)
    (tmp_path / "models--broken" / "snapshots" / "x" / "config.json").write_text("{not json")
    found = find_checkpoints([tmp_path, tmp_path / "missing"])
    assert [(f.name, f.complete) for f in found] == [
        ("Qwen/Qwen3-30B-A3B", True),
        ("Qwen/Qwen3-VL-2B-Instruct", True),
        ("Qwen/Qwen3-VL-8B-Instruct", False),
    ]
    assert found[1].path == good


def test_session_inputs_for_a_conversation_with_images(demo_model, tmp_path):
    from merlin.app.model.prompting import (
        GenerationOptions,
        Turn,
        answer_options,
        session_messages,
        session_settings,
    )
    from merlin.engine.session import Session

    image = QImage(64, 48, QImage.Format_RGB32)
    image.fill(0x336699)
    path = tmp_path / "a.png"
    image.save(str(path))
    turns = [
        Turn("user", "what is this?", [str(path)]),
        Turn("assistant", "a blue square"),
        Turn("user", "and now?", [str(path)]),
    ]
    messages = session_messages(turns)
    assert [(m.role, m.text, m.images) for m in messages] == [
        ("user", "what is this?", [str(path)]),
        ("assistant", "a blue square", []),
        ("user", "and now?", [str(path)]),
    ]
    opts = GenerationOptions(system_prompt="Be brief.", max_new_tokens=5, context_budget=2048)
    settings = session_settings(opts)
    assert settings.context_budget == 2048 and settings.max_pixels is None
    answer = answer_options(demo_model, opts)
    assert answer.max_new_tokens == 5
    assert answer.sampling == demo_model.defaults.sampling
    assert (answer.spec, answer.spec_k) == (opts.spec_mode, opts.spec_k)
    session = Session(demo_model, opts.system_prompt, settings)
    events = list(session.respond(messages, answer))
    prefill = next(e for e in events if type(e).__name__ == "PrefillDone")
    # both user turns carry the same picture: encoded once, its pads expanded twice
    assert prefill.n_tokens > 2 * session.messages[0].images[0].n_tokens
    assert session.budget == 2048
    opts.sampling = {
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    assert answer_options(demo_model, opts).sampling.greedy


def test_qt_free_modules_import_without_qt():
    code = (
        "import sys, merlin.app.model.store, merlin.app.model.markdown, merlin.app.model.mathtext, "
        "merlin.app.model.perf_stats, merlin.app.model.prompting, merlin.app.model.hf_scan; "
        "print(any(m.startswith(('PySide6', 'shiboken6')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_pyside_none_leak_is_guarded():
    from merlin.app import pyside_fixes

    pyside_fixes.install()
    if sys.version_info < (3, 12) and pyside_fixes.none_refcount_leak() > 0:
        assert sys.getrefcount(None) > pyside_fixes.NONE_GUARD // 2


def test_demo_screenshot_command(demo_dir, tmp_path):
    out = tmp_path / "shot.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "merlin.app.main",
            "--demo-screenshot",
            str(out),
            "--model",
            str(demo_dir),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    image = QImage(str(out))
    assert (image.width(), image.height()) == (1280, 720)


def test_words_from_outside_are_shown_as_written_never_as_html(qtbot, make_window):
    """A server's error page (a heading, a link) in a notice was drawn as HTML."""
    from PySide6.QtCore import Qt

    w = make_window()
    page = "the server failed (502) (<h1>502</h1><a href='http://evil.example/'>click</a>)"
    w.on_notice("error", page)
    assert w.notice_banner.label.textFormat() == Qt.PlainText
    widget = w.chat.add_message(1, "assistant", "an answer", state="error", error=page)
    widget.set_notices([page])
    for label in (widget.notices, widget.note, widget.status, w.composer.notice):
        assert label.textFormat() == Qt.PlainText


def test_the_banner_close_button_is_named_in_each_language(qtbot):
    """An icon alone, reached with Tab: it had no tooltip and no name for a screen reader."""
    from merlin.app.i18n import shared_translations
    from merlin.app.widgets.banner import Banner

    b = Banner()
    qtbot.addWidget(b)
    assert b.close_button.accessibleName() == b.close_button.toolTip() == "Dismiss"
    translations = shared_translations()
    assert translations.switch("zh_CN")
    try:
        qtbot.waitUntil(lambda: b.close_button.toolTip() == "关闭")  # LanguageChange is posted
    finally:
        translations.switch("en")
