"""The GUI never freezes: a 10 ms timer keeps firing while the model loads (with kernel
warm-up), while an answer about an image streams, and while a thinking model's 5,000-token
reasoning block (LaTeX and code) streams, collapsed and expanded.

When a beat is late the test says what the GUI thread was doing: per gap, its CPU time and
its wait for a CPU (Linux schedstat; the rest of the gap it was blocked: on the disk, on a
lock, on the GIL), and stacks of every thread sampled while the beat was overdue; the limit
applies to the gap less that wait for a CPU (other programs' load is not this app's). Past
causes: an SQLite commit waiting for fsync in the GUI thread (100-390 ms on a busy disk);
kernels compiled in the engine thread holding the GIL (warm-up in a child now). Known left:
sending a new image fsyncs its file in the GUI thread (app/store.py import_image_bytes), up
to ~130 ms on a disk busy with other writers."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from gui_helpers import data_dir, make_window, send  # noqa: F401 (fixtures)
from PySide6.QtCore import QTimer

from merlin.app.modes.demo_image import draw_demo_image

MAX_GAP_MS = 100
LATE_MS = 40  # a beat this overdue gets its threads' stacks sampled


def _sched_ms() -> tuple[float, float] | None:
    """(CPU time, time waiting for a CPU) of the calling thread so far, in ms (Linux)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            run, wait = f.read().split()[:2]
        return int(run) / 1e6, int(wait) / 1e6
    except (OSError, ValueError):
        return None


class Heartbeat:
    """A 10 ms QTimer in the GUI thread recording every gap between beats, per phase."""

    def __init__(self):
        self.phase = ""
        self.gaps: list[tuple[str, float, float, tuple | None]] = []  # phase, t, gap, sched
        self.samples: list[tuple[float, float, dict[str, str]]] = []  # t, overdue ms, stacks
        self._t0 = self._last = time.perf_counter()
        self._sched = _sched_ms()
        self._gui = threading.get_ident()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="heartbeat-watch", daemon=True)
        self.timer = QTimer(interval=10)
        self.timer.timeout.connect(self._beat)
        self.timer.start()
        self._watcher.start()

    def begin(self, phase: str) -> None:
        self.phase, self._last, self._sched = phase, time.perf_counter(), _sched_ms()

    def stop(self) -> None:
        self.timer.stop()
        self._stop.set()
        self._watcher.join(1)

    def _beat(self) -> None:
        now, sched = time.perf_counter(), _sched_ms()
        split = None
        if sched and self._sched:
            split = (sched[0] - self._sched[0], sched[1] - self._sched[1])
        self.gaps.append((self.phase, now - self._t0, (now - self._last) * 1e3, split))
        self._last, self._sched = now, sched

    def _watch(self) -> None:
        sampled = 0.0
        while not self._stop.wait(0.005):
            now = time.perf_counter()
            overdue = (now - self._last) * 1e3
            if overdue > LATE_MS and now - sampled > 0.02 and self.phase:
                sampled = now
                names = {t.ident: t.name for t in threading.enumerate()}
                stacks = {}
                for ident, frame in sys._current_frames().items():
                    if ident == threading.get_ident():
                        continue
                    top = traceback.extract_stack(frame)[-4:]
                    name = "GUI" if ident == self._gui else names.get(ident, str(ident))
                    stacks[name] = " < ".join(
                        f"{os.path.basename(s.filename)}:{s.lineno} {s.name}" for s in top[::-1]
                    )
                self.samples.append((now - self._t0, overdue, stacks))

    def worst(self, phase: str) -> float:
        """The longest gap of a phase, less the GUI thread's wait for a CPU in it: a machine
        whose cores other programs keep busy delays every window alike (a CI run's kernel
        builds once held the GUI thread runnable for 195 ms of a 205 ms gap); running, or
        blocked on the disk, a lock or the GIL, is what this process owns."""
        return max(
            (g - (split[1] if split else 0.0) for p, _, g, split in self.gaps if p == phase),
            default=0.0,
        )

    def count(self, phase: str) -> int:
        return sum(1 for p, *_ in self.gaps if p == phase)

    def report(self, phase: str, n: int = 4) -> str:
        """The n worst gaps of a phase, what the GUI thread did in each, stacks sampled."""
        worst = sorted((g for g in self.gaps if g[0] == phase), key=lambda g: -g[2])[:n]
        lines = [f"worst {phase} gaps (limit {MAX_GAP_MS} ms, less the wait for a CPU):"]
        for _, t, gap, split in worst:
            how = ""
            if split:
                cpu, runq = split
                off = max(0.0, gap - cpu - runq)
                how = (
                    f": GUI thread ran {cpu:.0f} ms, waited for a CPU {runq:.0f} ms, "
                    f"off CPU (idle or blocked: disk, lock, GIL) {off:.0f} ms"
                )
            lines.append(f"  {gap:.0f} ms ending at t={t:.3f} s{how}")
            for ts, overdue, stacks in self.samples:
                if t - gap / 1e3 <= ts <= t:
                    lines.append(f"    sampled {overdue:.0f} ms overdue:")
                    lines += [f"      {name}: {stack}" for name, stack in sorted(stacks.items())]
        return "\n".join(lines)


def test_event_loop_latency_during_load_and_generation(qtbot, make_window, tmp_path, demo_dir):
    heartbeat = Heartbeat()
    try:
        w = make_window(max_new_tokens=200)
        # a load with real work: q8 weights and KV (new to this run's weight cache and kernel
        # stamps: compiled in a child, quantized, warmed up)
        heartbeat.begin("load")
        w.controller.load_model(str(demo_dir), "q8", "q8")
        phases = []
        w.controller.sig_load_progress.connect(lambda f, phase: phases.append(phase))
        qtbot.waitUntil(lambda: w.controller.loading is None, timeout=120_000)
        assert w.controller.model is not None and w.controller.model.weights == "q8"
        assert "compiling kernels (first start only)" in phases
        heartbeat.begin("")
        w.composer.add_paths([str(draw_demo_image(tmp_path / "lake.png"))])
        w.composer.wait_attachments()
        heartbeat.begin("generation")
        send(qtbot, w, "Describe the picture in detail.")
    finally:
        heartbeat.stop()
    answer = w.store.messages(w.controller.current_id)[-1]
    assert answer.state == "done" and answer.stats["tokens"] > 20
    print(
        f"\nheartbeat: load max {heartbeat.worst('load'):.1f} ms over "
        f"{heartbeat.count('load')} beats; generation max {heartbeat.worst('generation'):.1f} "
        f"ms over {heartbeat.count('generation')} beats "
        f"({answer.stats['tokens']} tokens and an image, "
        f"{answer.stats.get('tokens_per_s', 0):.0f} tok/s)"
    )
    assert heartbeat.worst("load") < MAX_GAP_MS, heartbeat.report("load")
    assert heartbeat.worst("generation") < MAX_GAP_MS, heartbeat.report("generation")


REASONING_LINE = (
    "Let $f(x) = \\frac{x^2}{2}$, so $f'(x) = x$ and $$\\int_0^1 f = \\tfrac16.$$ "
    "Check it in code:\n```python\ndef f(x):\n    return x * x / 2\n```\n"
)


def test_heartbeat_while_5000_reasoning_tokens_stream(qtbot, make_window):
    """5,000 reasoning tokens with LaTeX and code, sent from another thread as the engine
    sends its events, at ~1,000 tokens/s: the GUI never stalls, collapsed or expanded."""
    from merlin.engine.generate import Finished, Tokens
    from merlin.engine.profile import StepProfile

    def tokens(text="", reasoning=""):
        return Tokens(text, [1], StepProfile(), reasoning, 1 if reasoning else 0)

    w = make_window()
    jobs = []
    w.controller.conversation.engine.generate = jobs.append  # the test sends the events
    send(qtbot, w, "Prove it.", wait=False)
    qtbot.waitUntil(lambda: len(jobs) == 1)
    job = jobs[0]
    words = REASONING_LINE.replace("\n", "\n ").split(" ")
    pieces = [(words[i % len(words)] + " ").replace("\n ", "\n") for i in range(5000)]
    signal = w.controller.worker.sig_event  # queued to the GUI thread, like the engine's

    def engine():
        for i, piece in enumerate(pieces):
            signal.emit(job.job_id, tokens(reasoning=piece))
            if i % 2:
                time.sleep(0.002)
        for i in range(200):
            signal.emit(job.job_id, tokens(text=f"answer {i} "))
        signal.emit(job.job_id, Finished("stop_token", generated_tokens=5200, reasoning="x"))

    heartbeat = Heartbeat()
    try:
        heartbeat.begin("collapsed")
        t = threading.Thread(target=engine, daemon=True)
        t.start()
        qtbot.waitUntil(lambda: w.chat.messages()[-1].reasoning is not None, timeout=10_000)
        block = w.chat.messages()[-1].reasoning
        qtbot.waitUntil(lambda: len(block.text) > 8000, timeout=30_000)
        heartbeat.begin("expanded")
        block.set_expanded(True)
        qtbot.waitUntil(lambda: not w.controller.busy, timeout=60_000)
        t.join(5)
    finally:
        heartbeat.stop()
    row = w.store.messages(w.controller.current_id)[-1]
    assert row.reasoning == "".join(pieces)
    assert "\\frac" in row.reasoning and "```python" in row.reasoning
    assert block.body.toPlainText() == row.reasoning
    print(
        f"\nheartbeat (5,000 reasoning tokens): collapsed max {heartbeat.worst('collapsed'):.1f} "
        f"ms over {heartbeat.count('collapsed')} beats; expanded max "
        f"{heartbeat.worst('expanded'):.1f} ms over {heartbeat.count('expanded')} beats"
    )
    assert heartbeat.count("collapsed") > 10 and heartbeat.count("expanded") > 10
    assert heartbeat.worst("collapsed") < MAX_GAP_MS, heartbeat.report("collapsed")
    assert heartbeat.worst("expanded") < MAX_GAP_MS, heartbeat.report("expanded")
