"""`python -m merlin.engine.bench` end to end on the small demo checkpoint: every figure the report
promises is there and plausible (the figures themselves are the benchmark's business)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from merlin.engine.bench import __main__ as bench


def test_decode_prefill_report(demo_dir, tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, MERLIN_WEIGHT_CACHE=str(tmp_path / "weights"))
    done = subprocess.run(
        [sys.executable, "-m", "merlin.engine.bench", "decode", "prefill", "--model", str(demo_dir)]
        + ["--weights", "f32,q4", "--kv", "q8", "--contexts", "16", "40", "--no-compile"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["machine"]["bandwidth_gbs"] > 0 and report["machine"]["sgemm_gflops"] > 0
    assert [(r["weights"], r["kv"]) for r in report["runs"]] == [("f32", "q8"), ("q4", "q8")]
    for r in report["runs"]:
        assert [d["context"] for d in r["decode"]] == [16, 40]
        for d in r["decode"]:
            assert d["ms_per_token"] >= d["gemm_ms"] > 0 and d["attn_ms"] > 0
        verify = r["verify"]
        expected = ["T_ms", "V(4)_split_ms"] + [f"V({k})/T" for k in range(1, 9)]
        assert sorted(verify) == sorted(expected)
        split = verify["V(4)_split_ms"]
        for which in ("T", "V"):
            assert split[which]["gemm"] > 0 and split[which]["attn"] > 0
            assert split[which]["other"] >= 0
        assert sum(split["T"].values()) < 2 * verify["T_ms"]
        assert r["prefill"]["tokens_per_s"] > 0
        assert 0 < r["peak_rss_bytes"] < 4e9  # the child's own peak, not the parent's
    f32, q4 = report["runs"]
    assert q4["weight_bytes_per_token"] < f32["weight_bytes_per_token"] / 3
    assert "load" not in report and "compile" not in report  # --no-compile
    assert "machine: read bandwidth" in done.stdout and "V(4) vs T ms: gemm" in done.stdout


def test_load_and_compile_times(demo_dir, tmp_path, monkeypatch, capsys):
    """The first-load run quantizes into an empty weight cache and the second reads it, each in
    a process of its own; the compile runs are two children on one kernel cache that starts
    empty (the children themselves are not run here: a cold compile takes a minute)."""
    monkeypatch.setenv("MERLIN_WEIGHT_CACHE", str(tmp_path / "weights"))
    load = bench.load_times(demo_dir, "q4")
    assert load["first_s"] > 0 and load["cached_s"] > 0
    assert 0 < load["first_peak_rss_bytes"] < 4e9 and 0 < load["cached_peak_rss_bytes"] < 4e9
    assert not (tmp_path / "weights").exists()  # the runs had a cache folder of their own

    caches = []

    def child(model, weights, kv, what, contexts, env=None):
        folder = Path(env["NUMBA_CACHE_DIR"])
        caches.append((folder, sorted(folder.iterdir()), (model, weights, kv, what, contexts)))
        (folder / f"kernels-{len(caches)}").touch()
        return {"first_forward_s": 9.0 if len(caches) == 1 else 0.5}

    monkeypatch.setattr(bench, "run_child", child)
    assert bench.compile_times(demo_dir, "q4", "f32") == {"cold_s": 9.0, "warm_s": 0.5}
    (cold, cold_files, cold_args), (warm, warm_files, warm_args) = caches
    assert cold == warm and cold_files == [] and warm_files == [cold / "kernels-1"]
    assert cold_args == warm_args == (demo_dir, "q4", "f32", ["decode"], [16])
    assert not cold.exists()  # the temporary cache is gone

    machine = {"bandwidth_gbs": 20.0, "sgemm_gflops": 100.0}
    machine |= {"before": {"best_gbs": 20.0}, "after": {"best_gbs": 19.0}}
    compiled = {"q4/f32": {"cold_s": 9.0, "warm_s": 0.5}}
    bench.print_table(
        {"machine": machine, "threads": 2, "runs": [], "load": {"q4": load}, "compile": compiled}
    )
    printed = capsys.readouterr().out
    assert f"load q4 weights: first {load['first_s']:.1f} s" in printed
    assert "numba compile (q4/f32): cold 9.0 s, warm 0.50 s" in printed


def test_serve_report(demo_dir, tmp_path):
    """`bench serve`: the same request in-process and through `merlin-cli serve`, same run."""
    out = tmp_path / "serve.json"
    done = subprocess.run(
        [sys.executable, "-m", "merlin.engine.bench", "serve", "--model", str(demo_dir)]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(out.read_text())["serve"]
    for side in ("in_process", "http"):
        assert len(s["runs"][side]) == s["rounds"]
        assert all(r["tokens"] == s["answer_tokens"] for r in s["runs"][side])
        assert s[side]["ttft_ms"] > 0 and s[side]["tokens_per_s"] > 0
    assert s["paired"]["ttft_overhead_ms"] > 0  # the client sees the first token later
    assert all(r["engine_tokens_per_s"] > 0 for r in s["runs"]["http"])
    assert "server overhead: TTFT" in done.stdout and "paired" in done.stdout


def _bench(*args, env_extra=None, timeout=900):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "merlin.engine.bench", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_unknown_section_is_an_error_listing_the_sections():
    done = _bench("decod")
    assert done.returncode == 2
    assert "unknown section decod" in done.stderr and "board peer" in done.stderr


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["kernels", "--threads", "0"], "--threads: 0 is not at least 1"),
        (["kernels", "--repeats", "0"], "--repeats: 0 is not at least 1"),
        (["vision", "--size", "16x-16"], "width and height must be at least 1"),
        (["vision", "--size", "abc"], "is not WIDTHxHEIGHT"),
        (["peer", "--flash-attn", "maybe"], "give on, off"),
        (["board", "--board-bandwidth", "nan"], "is not a number above 0"),
        (["session", "--weights", "q5"], "give f32, q8, q4"),
        (["kernels", "--json", "/nonexistent-merlin/k.json"], "a folder that exists"),
        (["spec", "--model", "/nonexistent-merlin"], "bench: error: /nonexistent-merlin: no such"),
    ],
)
def test_bad_arguments_are_one_line_before_any_run(args, fragment):
    """Each had been a traceback, a table of nan, or a run of minutes whose figures were lost
    at the end (an unwritable --json)."""
    done = _bench(*args, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert fragment in done.stderr, done.stderr[-2000:]


def test_kernels_section(tmp_path):
    """The kernel roofline figures (the former engine.qlinear_bench), in cache, one repeat."""
    out = tmp_path / "kernels.json"
    done = _bench("kernels", "--in-cache", "--repeats", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())["kernels"]
    rows = report["decode"]
    assert {r["fmt"] for r in rows} == {"f32", "q8", "q8g", "q4"}
    assert all(r["GBps"] > 0 and r["V_over_T"] > 0 for r in rows)
    assert report["quantize"]["q4"]["s_per_100M"] > 0
    assert "decode / verify" in done.stdout


def test_board_section_without_llvm_mca_says_how_to_install_it():
    done = _bench("board", env_extra={"MERLIN_LLVM_MCA": ""})
    assert done.returncode == 2
    assert "llvm-mca" in done.stderr and "apt-get install llvm" in done.stderr
    assert "Traceback" not in done.stderr
