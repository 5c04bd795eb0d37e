"""The `moe` benchmark section runs end to end on the small MoE fixture and reports what it
should (no timing is asserted: performance lives in the benchmark, not in tests)."""

import shutil

import pytest
from support import FIXTURES

from merlin.engine.bench import moe as moe_bench
from merlin.engine.bench import peer
from merlin.engine.bench.sections import SectionUnavailable
from merlin.engine.demo_tokenizer import write_demo_tokenizer


@pytest.fixture(scope="module")
def merlin_result(tmp_path_factory):
    """moe_bench.run on the small MoE fixture, once for the module."""
    tmp = tmp_path_factory.mktemp("moe")
    mp = pytest.MonkeyPatch()
    mp.setenv("MERLIN_WEIGHT_CACHE", str(tmp / "cache"))
    folder = tmp / "m"
    shutil.copytree(FIXTURES / "moe_text_sharded", folder)
    write_demo_tokenizer(folder)
    try:
        yield moe_bench.run(folder, formats=("q4",), contexts=(16, 40), steps=2)
    finally:
        mp.undo()


def test_moe_section_reports_every_figure(merlin_result):
    r = merlin_result
    (x,) = r["runs"]
    assert [d["context"] for d in x["decode"]] == [16, 40]
    assert all(d["experts_read"] == 2 * 4 for d in x["decode"])  # 2 routed layers, k = 4
    assert all(0 < d["bandwidth_fraction"] for d in x["decode"])
    assert "V(4)/T" in x["verify"] and x["prefill_tokens_per_s"] > 0
    assert 0 < x["routing_fraction"] and x["routing_ms_per_token"] > 0
    p = x["projection_48"]
    assert p["bytes_per_token"] > x["weight_bytes_per_token"]  # 48 layers instead of 4
    assert x["board"]["bound_tokens_per_s"] > x["board"]["at_this_fraction_tokens_per_s"] > 0
    text = moe_bench.report(r)
    assert "decode ctx" in text and "48 layers" in text
    assert "llama.cpp" not in text  # run() is Merlin alone; main_section adds the comparison


def _args(**kw):
    from types import SimpleNamespace

    base = dict(model="m", weights="q4", kv="q8", contexts=[16, 40], moe_layers=4,
                no_peer=False, flash_attn="on", no_check=False, repeats=1, threads=1)  # fmt: skip
    return SimpleNamespace(**(base | kw))


@pytest.fixture
def merlin_only(merlin_result, monkeypatch):
    """main_section with Merlin's part already measured (a copy of merlin_result)."""
    import copy

    monkeypatch.setattr(moe_bench, "run", lambda *a, **k: copy.deepcopy(merlin_result))


def test_without_llama_cpp_merlin_figures_stand_and_the_reason_is_given(
    merlin_only, monkeypatch, capsys
):
    def unavailable(progress=print):
        raise SectionUnavailable("building llama.cpp failed (needs a C++ compiler and cmake)")

    monkeypatch.setattr(peer, "ensure_llama_cpp", unavailable)
    r = moe_bench.main_section(_args())
    out = capsys.readouterr().out
    assert r["runs"][0]["decode"][0]["ms_per_token"] > 0
    assert "decode ctx" in out
    assert "no comparison: llama.cpp is not available" in out and "C++ compiler" in out
    assert r["llama_cpp"].startswith("no comparison")


def test_no_peer_skips_llama_cpp(merlin_only, monkeypatch, capsys):
    def must_not_run(progress=print):
        raise AssertionError("llama.cpp was asked for with --no-peer")

    monkeypatch.setattr(peer, "ensure_llama_cpp", must_not_run)
    r = moe_bench.main_section(_args(no_peer=True))
    assert r["llama_cpp"] == "not run (--no-peer)"
    assert "llama.cpp: not run (--no-peer)" in capsys.readouterr().out


def test_peer_report_lists_the_check_and_each_format():
    rows = [{"weights": w, "flash_attn": True, "what": what, "merlin_ms": 10.0,
             "llama_cpp_ms": 15.0, "ratio": 1.5, "ratio_range": [1.4, 1.6]}
            for w in ("q8", "q4") for what in ("decode @ 128", "prefill 512")]  # fmt: skip
    check = {"checkpoint": "qwen3-moe-tiny-random-2l-v1", "prompt": [1], "merlin": [5, 6],
             "llama_cpp": [5, 6], "same": True}  # fmt: skip
    text = moe_bench.peer_report({"llama_cpp_python": "0.3.36", "threads": 2, "repeats": 3,
                                  "summary": rows, "check": check})  # fmt: skip
    assert "qwen3-moe-tiny-random-2l-v1" in text and "SAME" in text
    assert "q8/Q8_0" in text and "q4/Q4_0" in text and "1.50" in text
