"""`python -m merlin.engine.bench vision`'s end-to-end part (bench/vision_ttft.py) runs on a
small checkpoint and reports what it promises: f32 and q8 encodes, time to first token, the
448x448 question with its greedy answers, the board projection."""

from __future__ import annotations

from merlin.engine.bench import vision_ttft


def test_vision_ttft_runs_and_reports(demo_dir):
    r = vision_ttft.run(tokens=[64], repeats=1, folder=demo_dir, progress=lambda m: None)
    (row,) = r["budgets"]
    assert row["size"][0] == row["size"][1] > 0
    target = r["target"]
    assert target["size"] == list(vision_ttft.TARGET_SIZE)
    for figures in (row, target):
        assert figures["ttft_s"] > 0 and figures["ttft_cpu_s"] > 0
    assert "greedy" in target
    # attached before the question: the image rows were computed while typing
    assert target["ttft_after_attach_s"] > 0
    assert target["after_attach_reused"] > target["tokens"]
    assert target["after_attach_prefill_tokens"] < target["prompt_tokens"] - target["tokens"]
    text = vision_ttft.report(r)
    assert "448" in text and "board" in text.lower()
