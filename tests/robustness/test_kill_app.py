"""kill -9 of the app during generation: nothing the user sent is lost.

The real app (`python -m merlin.app.main --script FILE`, see app/scripted.py) runs offscreen on the
demo checkpoint in a fresh data folder, sending one message after each answer and printing
`SENT <id> <line>` once a message is committed. It is killed with SIGKILL at seeded random
moments: while it starts, while the model loads (the first message is already stored as
queued) and while answers stream (the answer is committed every half second). Afterwards
the SQLite chat store must pass `PRAGMA integrity_check`, open with the app's Store (which
marks a half-written answer `interrupted`) and hold every user message a SENT line was printed
for, and every answer an ANSWERED line was printed for, in its final state. A store that
deferred its commits (to the end, or to a later message) fails here.

A warm-up run (not killed) compiles or loads the kernels, a second one times the phases; the
killed runs reuse the Numba cache and weight cache, so each takes one to three seconds.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from merlin.app.model.store import DB_NAME, Store

REPO = Path(__file__).resolve().parents[2]
MESSAGES = [
    f"message {i}: tell me about boats number {i} " + "and lakes " * (i % 5) for i in range(60)
]
MAX_NEW_TOKENS = 160  # ~0.4 s per answer on the demo checkpoint: several turns per run
# (phase, runs): where the kill is aimed. "start": any moment from the process start (Qt,
# store creation, first message); "load": after the first SENT, before the model is ready;
# "answer": after LOADED, somewhere in the next few seconds of answers.
PLAN = [("start", 4), ("load", 8), ("answer", 12)]
CASES = [(phase, i) for phase, n in PLAN for i in range(n)]
ATTEMPTS = 4  # a kill aimed at a phase that it missed (timing) is retried with a shorter delay


@dataclass
class Run:
    """One app process: its output lines with the time each arrived."""

    proc: subprocess.Popen
    t0: float
    stderr: Path
    lines: list[tuple[float, str]] = field(default_factory=list)
    events: dict[str, threading.Event] = field(
        default_factory=lambda: {"SENT": threading.Event(), "LOADED": threading.Event()}
    )

    def start_reading(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.strip()
            self.lines.append((time.monotonic() - self.t0, line))
            for word, event in self.events.items():
                if line.startswith(word):
                    event.set()

    def words(self, word: str) -> list[list[str]]:
        return [line.split()[1:] for _, line in self.lines if line.split()[:1] == [word]]

    def time_of(self, word: str) -> float:
        return next(t for t, line in self.lines if line.startswith(word))


def start(data: Path, script: Path, demo_dir: Path, env: dict) -> Run:
    data.mkdir(parents=True)
    # QSettings' INI format: short answers so that several turns happen per run
    (data / "settings.ini").write_text(
        f"[General]\nmax_new_tokens={MAX_NEW_TOKENS}\nlanguage=en\n", encoding="utf-8"
    )
    stderr = data.parent / f"{data.name}.stderr"
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "merlin.app.main",
                "--model",
                str(demo_dir),
                "--script",
                str(script),
            ],
            cwd=REPO,
            env={**os.environ, **env, "MERLIN_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,  # its own process group: a warm-up child dies with it
        )
    run = Run(proc, time.monotonic(), stderr)
    run.start_reading()
    return run


def end(run: Run, kill: bool = True) -> None:
    """SIGKILL the app's process group (unless it ended), then take the rest of its output."""
    if kill:
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run.proc.wait(30)
    run.reader.join(30)
    run.proc.stdout.close()


@pytest.fixture(scope="module")
def app_env(demo_dir, tmp_path_factory):
    """Script file, shared caches, and phase timings from complete (unkilled) runs."""
    root = tmp_path_factory.mktemp("kill-app")
    script = root / "script.txt"
    script.write_text("\n".join(MESSAGES) + "\n", encoding="utf-8")
    short = root / "short.txt"
    short.write_text("\n".join(MESSAGES[:2]) + "\n", encoding="utf-8")
    env = {"MERLIN_KERNEL_STAMPS": os.environ.get("MERLIN_KERNEL_STAMPS", str(root / "stamps"))}
    for name in ("warm", "timed"):  # the first may compile kernels; the second is timed
        run = start(root / name, short, demo_dir, env)
        try:
            code = run.proc.wait(600)
        finally:
            end(run, kill=run.proc.poll() is None)
        assert code == 0, run.stderr.read_text()
        assert [n for _, n in run.words("SENT")] == ["1", "2"], run.lines
        assert run.words("ANSWERED") == [["done"], ["done"]]
    t_sent, t_loaded = run.time_of("SENT"), run.time_of("LOADED")
    return {
        "script": script,
        "env": env,
        "root": root,
        "t_sent": t_sent,
        "t_load": max(0.05, t_loaded - t_sent),
    }


def check_store(folder: Path, run: Run) -> str:
    """The store after the kill: intact, with everything the app said it saved. Returns
    where the kill landed: start, load, answer or between (two answers)."""
    sent = run.words("SENT")  # [[message id, line number], ...]
    answered = [w[0] for w in run.words("ANSWERED")]
    db = folder / DB_NAME
    if not db.exists():
        assert not sent, f"{len(sent)} message(s) reported saved, but there is no database"
        return "start"
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        raw.close()
    store = Store(folder)  # the app's own open: schema check, recovery of a streaming answer
    try:
        conversations = store.conversations()
        rows = [r for c in conversations for r in store.messages(c.id)]
        users = {r.id: r.text for r in rows if r.role == "user"}
        for mid, line in sent:
            assert users.get(int(mid)) == MESSAGES[int(line) - 1], (
                f"message {line} (id {mid}) was reported saved before the kill but is "
                f"{'missing' if int(mid) not in users else 'different'} in the store"
            )
        finished = [r for r in rows if r.role == "assistant" and r.state != "interrupted"]
        assert len(finished) >= len(answered), "an answer reported finished was not saved"
        assert [r.state for r in finished[: len(answered)]] == answered
        assert store.interrupted <= 1 and not any(r.state == "streaming" for r in rows)
        last_row = rows[-1] if rows else None
    finally:
        store.close()
    if not any(line == "LOADED" for _, line in run.lines):
        return "load" if sent else "start"
    last = [line for _, line in run.lines if line.split()[:1] in (["ANSWERING"], ["ANSWERED"])]
    if not last or last[-1] != "ANSWERING":
        return "between"
    # ANSWERING is printed after the answer's row was committed as streaming: it is there,
    # marked interrupted (or final, when the kill fell just after its last commit)
    assert last_row is not None and last_row.role == "assistant", rows
    assert last_row.state in ("interrupted", "done", "stopped", "error"), last_row
    return "answer"


@pytest.mark.parametrize(("phase", "index"), CASES, ids=[f"{p}-{i}" for p, i in CASES])
def test_kill_app_during_generation(app_env, demo_dir, phase, index):
    rng = random.Random(f"{phase}-{index}")
    landed = []
    for attempt in range(ATTEMPTS):
        folder = app_env["root"] / f"{phase}-{index}-{attempt}"
        run = start(folder, app_env["script"], demo_dir, app_env["env"])
        try:
            if phase == "start":
                anchor, delay = None, rng.uniform(0.0, app_env["t_sent"] + 0.1)
            elif phase == "load":
                anchor, delay = "SENT", rng.uniform(0.0, 0.5 * app_env["t_load"]) / 2**attempt
            else:
                anchor, delay = "LOADED", rng.uniform(0.05, 3.0)
            if anchor is not None:
                assert run.events[anchor].wait(120), (
                    f"no {anchor} line: {run.lines} {run.stderr.read_text()}"
                )
            time.sleep(delay)
        finally:
            alive = run.proc.poll() is None
            end(run)
        assert alive, f"the app ended before the kill: {run.stderr.read_text()}"
        where = check_store(folder, run)
        landed.append(where)
        if phase == "start" or where == phase:
            print(f"{phase}-{index}: kills landed {landed}, {len(run.words('SENT'))} sent")
            return
    pytest.fail(f"kills aimed at {phase!r} landed in {landed}")
