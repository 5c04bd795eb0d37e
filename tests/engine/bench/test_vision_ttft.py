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
    assert all(r["host_peaks"][k] > 0 for k in ("f32", "int8", "f32_core", "int8_core"))
    assert target["q8"]["board_s"] > 0
    text = vision_ttft.report(r)
    assert "448" in text and "board" in text.lower() and "peaks" in text


class _Encode:
    ms, gemm_ms, attn_ms = 1000.0, 600.0, 300.0


def test_board_projection_scales_each_part_by_its_peak_ratio():
    board = vision_ttft.board_peaks()
    same = vision_ttft.board_seconds(_Encode, "q8", board)  # a host as fast as the board
    assert abs(same - 1.0) < 1e-12
    twice = {k: 2 * v for k, v in board.items()}
    assert abs(vision_ttft.board_seconds(_Encode, "q8", twice) - 2.0) < 1e-12
    faster_ints = {**board, "int8": 4 * board["int8"]}  # q8's products: int8; the rest: f32
    assert abs(vision_ttft.board_seconds(_Encode, "q8", faster_ints) - (0.9 * 4 + 0.1)) < 1e-12
    assert abs(vision_ttft.board_seconds(_Encode, "f32", faster_ints) - 1.0) < 1e-12
    # the element-wise rest: all cores' f32 peak in q8 (rows split over threads), one in f32
    cores = {**board, "f32": 3 * board["f32"]}
    assert abs(vision_ttft.board_seconds(_Encode, "q8", cores) - (0.9 + 0.1 * 3)) < 1e-12
    core = {**board, "f32_core": 5 * board["f32_core"]}
    assert abs(vision_ttft.board_seconds(_Encode, "q8", core) - 1.0) < 1e-12
    assert abs(vision_ttft.board_seconds(_Encode, "f32", core) - (0.9 * 1 + 0.1 * 5)) < 1e-12
