"""The `moe` benchmark section runs end to end on the small MoE fixture and reports what it
should (no timing is asserted: performance lives in the benchmark, not in tests)."""

import shutil

from support import FIXTURES

from merlin.engine.bench import moe as moe_bench
from merlin.engine.demo_tokenizer import write_demo_tokenizer


def test_moe_section_reports_every_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "m"
    shutil.copytree(FIXTURES / "moe_text_sharded", folder)
    write_demo_tokenizer(folder)
    r = moe_bench.run(folder, formats=("q4",), contexts=(16, 40), steps=2)
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
    assert "decode ctx" in text and "48 layers" in text and "llama.cpp" in text
