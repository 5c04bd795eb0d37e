"""`merlin --self-test`, the installer's check, run as a user runs it (a child process): it
passes on the shipped demo model, and fails with a clear message when the engine's answer is
not the reference one (a copy of the demo folder whose stored reference is another answer)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from merlin.engine import demo_model


def self_test(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "merlin.app.main", "--self-test", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def test_shipped_demo_model_has_a_reference_answer(shapes_dir):
    case = demo_model.self_test_reference(shapes_dir)
    stored = json.loads((shapes_dir / demo_model.SELF_TEST_FILE).read_text(encoding="utf-8"))
    assert case["answer"] == stored["answer"] and case["answer"].strip()
    assert case["question"] == demo_model.SELF_TEST_QUESTION


def test_self_test_passes_on_the_demo_model(tmp_path):
    """It passes, and leaves nothing in the temporary folder (each run had left 1 MB)."""
    import os

    done = self_test(env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED" in done.stdout
    assert "the reference answer" in done.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("merlin-self-test-")]


def test_self_test_fails_when_the_answer_differs_from_the_reference(shapes_dir, tmp_path):
    copy = tmp_path / "demo-copy"
    shutil.copytree(shapes_dir, copy)
    case = demo_model.self_test_reference(shapes_dir)
    wrong = "The circle is purple." if case["answer"] != "The circle is purple." else "Hello."
    (copy / demo_model.SELF_TEST_FILE).write_text(
        json.dumps({**case, "answer": wrong}), encoding="utf-8"
    )
    done = self_test("--model", str(copy))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "self-test FAILED" in done.stderr
    assert repr(wrong) in done.stderr and "computes wrong numbers" in done.stderr


def test_reference_falls_back_to_the_truth_without_the_file(tmp_path):
    case = demo_model.self_test_reference(tmp_path)
    assert case["answer"] == case["truth"] == "The circle is red."
