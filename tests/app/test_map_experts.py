"""The "keep the experts memory-mapped" setting of mixture-of-experts models: stored like the
other settings, edited in the Settings dialog, carried by the load request to
engine.model.load_model(map_experts=...), and the mapped experts shown in the panel. The
model is the small random MoE checkpoint of tests/fixtures (moe_text_sharded) with the demo
tokenizer, converted into a weight cache in the test's folder."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from gui_helpers import data_dir, make_window  # noqa: F401 (fixtures)
from PySide6.QtCore import QSettings
from support import FIXTURES

from merlin.app.model.jobs import LoadRequest
from merlin.app.settings import AppSettings, SettingsDialog, load_settings, save_settings

CHOICES = {"auto": None, "always": True, "never": False}  # in the dialog's order


@pytest.fixture
def moe_folder(tmp_path, monkeypatch):
    from merlin.engine.demo_tokenizer import write_demo_tokenizer

    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "moe"
    shutil.copytree(FIXTURES / "moe_text_sharded", folder)
    write_demo_tokenizer(folder)
    return folder


def test_the_setting_round_trips_and_an_unknown_value_reads_as_auto(tmp_path):
    path = str(tmp_path / "s.ini")
    assert AppSettings().map_experts == "auto"
    for choice in CHOICES:
        save_settings(AppSettings(map_experts=choice), QSettings(path, QSettings.IniFormat))
        assert load_settings(QSettings(path, QSettings.IniFormat)).map_experts == choice
    qs = QSettings(path, QSettings.IniFormat)
    qs.setValue("map_experts", "sometimes")
    qs.sync()
    assert load_settings(QSettings(path, QSettings.IniFormat)).map_experts == "auto"


def test_the_dialog_shows_and_saves_the_setting(qtbot, tmp_path):
    d = SettingsDialog(AppSettings(map_experts="never", language="en"))
    qtbot.addWidget(d)
    combo = d.map_experts
    assert combo.currentData() == "never" and combo.currentText() == "Never"
    assert [combo.itemData(i) for i in range(combo.count())] == list(CHOICES)
    assert combo.itemText(0).startswith("Auto") and "would not fit" in combo.itemText(0)
    tip = combo.toolTip()
    assert all(f"{word}:" in tip for word in ("Auto", "Always", "Never"))
    assert "next model load" in d.labels["map_experts"].text()
    combo.setCurrentIndex(combo.findData("always"))
    saved = d.result_settings()
    assert saved.map_experts == "always"
    qs = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    save_settings(saved, qs)
    assert load_settings(qs).map_experts == "always"
    d.buttons.button(d.buttons.StandardButton.RestoreDefaults).click()
    assert d.result_settings().map_experts == "auto"
    # a stored value the dialog does not know shows (and saves) Auto
    odd = SettingsDialog(AppSettings(map_experts="sometimes"))
    qtbot.addWidget(odd)
    assert odd.map_experts.currentData() == "auto" and odd.result_settings().map_experts == "auto"


def test_the_dialog_in_chinese(qtbot):
    from merlin.app.i18n import shared_translations

    translations = shared_translations()
    assert translations.switch("zh_CN")
    try:
        d = SettingsDialog(AppSettings(language="zh_CN"))
        qtbot.addWidget(d)
        assert "内存映射" in d.labels["map_experts"].text()
        assert d.map_experts.itemText(1) == "总是" and "自动" in d.map_experts.toolTip()
    finally:
        translations.switch("en")


def test_the_worker_passes_the_setting_to_load_model(qtbot, moe_folder, monkeypatch):
    from merlin.app.worker import EngineWorker
    from merlin.engine import memory
    from merlin.engine import model as model_mod

    real, calls = model_mod.load_model, []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("map_experts", "not passed"))
        return real(*args, **kwargs)

    monkeypatch.setattr(model_mod, "load_model", spy)
    worker = EngineWorker()  # no thread: load() runs here
    loaded, failed = [], []
    worker.sig_loaded.connect(loaded.append)
    worker.sig_load_failed.connect(failed.append)

    def load(choice):
        request = LoadRequest(str(moe_folder), "q4", "f32", warm_up=False)
        request.map_experts = CHOICES[choice]
        worker.load(request)
        assert not failed, failed
        return loaded[-1]

    mapped = load("always")
    assert calls == [True]
    assert mapped.mapped_expert_bytes > 0
    assert mapped.mapped_expert_bytes == worker.model.memory.mapped_experts
    assert worker.model.experts_mapped
    assert load("never").mapped_expert_bytes == 0 and not worker.model.experts_mapped
    assert load("auto").mapped_expert_bytes == 0  # it fits in this machine's memory
    assert calls == [True, False, None]
    # auto maps them when the model would not fit in memory otherwise (engine/model.py)
    fits = worker.model.memory.total
    monkeypatch.setenv(memory.ENV_AVAILABLE, str(fits - 1))
    assert load("auto").mapped_expert_bytes > 0 and calls[-1] is None


def test_the_panel_shows_mapped_experts(qtbot, make_window, moe_folder):
    w = make_window(model=str(moe_folder), weights="q4", kv="f32", map_experts="always")
    info = w.controller.model
    assert info is not None and info.mapped_expert_bytes > 0, w.model_banner.text()
    text = w.panel.model_label.text()
    assert "memory-mapped from the weight cache" in text.splitlines()[-1]
    assert "memory-mapped" in w.panel.values["memory"].toolTip()
    # applies at the next load: the model in use keeps its mapped experts
    w.apply_settings(dataclasses.replace(w.settings, map_experts="never"))
    assert load_settings().map_experts == "never"  # saved (the test's data folder)
    assert w.controller.model.mapped_expert_bytes > 0
    w.controller.load_model(str(moe_folder), "q4", "f32")
    qtbot.waitUntil(lambda: w.controller.loading is None, timeout=120_000)
    assert w.controller.model.mapped_expert_bytes == 0
    assert "memory-mapped" not in w.panel.model_label.text()
    assert w.panel.values["memory"].toolTip() == ""


def test_the_load_is_sized_for_the_apps_context_budget(qtbot, moe_folder, monkeypatch):
    """The memory guard (and with it auto's mapping decision, engine/model.py) sizes the KV
    cache for the context budget the load request carries, not the engine's default: with
    memory for a 256-token context, that budget loads and the default's larger one is
    refused."""
    from merlin.app.worker import EngineWorker
    from merlin.engine import memory
    from merlin.engine.config import load_config

    config = load_config(moe_folder)

    def total(context):
        return memory.estimate_for(config, moe_folder, "q4", "f32", context).total

    assert total(256) < total(None)
    monkeypatch.setenv(memory.ENV_AVAILABLE, str(total(256)))
    worker = EngineWorker()
    loaded, failed = [], []
    worker.sig_loaded.connect(loaded.append)
    worker.sig_load_failed.connect(failed.append)
    worker.load(LoadRequest(str(moe_folder), "q4", "f32", warm_up=False, context=256))
    assert loaded and not failed, failed
    worker.load(LoadRequest(str(moe_folder), "q4", "f32", warm_up=False))
    assert len(loaded) == 1 and "not enough memory" in failed[-1]
