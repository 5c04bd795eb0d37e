"""Time an import of 20,000 messages (20 chats of 1,000, ~300 characters each) added in one
transaction against steps of store_import.IMPORT_STEP messages, and the longest step, which
is how long the window's own writes can wait for the import (docs/robustness.md, "The GUI
thread"). Alternating, 3 rounds, medians.

    python docs/microbench/import_steps.py
"""

import contextlib
import statistics
import tempfile
import time

from merlin.app.model import store_import
from merlin.app.model.store import Store


def chats():
    return [
        (
            f"chat {c}",
            None,
            [
                ("user" if i % 2 == 0 else "assistant", "word " * 60 + str(i), "done", {}, [], None)
                for i in range(1000)
            ],
        )
        for c in range(20)
    ]


def timed(step):
    with tempfile.TemporaryDirectory(prefix="merlin-import-bench-") as folder:
        return timed_in(folder, step)


def timed_in(folder, step):
    store = Store(folder)
    real, longest = store._transaction, [0.0]

    @contextlib.contextmanager
    def measured():
        t0 = time.perf_counter()
        with real() as db:
            yield db
        longest[0] = max(longest[0], time.perf_counter() - t0)

    store._transaction = measured
    data = chats()
    t0 = time.perf_counter()
    store.add_conversations(data, step=step)
    total = time.perf_counter() - t0
    store.close()
    return total, longest[0]


results = {}
for _ in range(3):
    for step in (10**9, store_import.IMPORT_STEP):
        results.setdefault(step, []).append(timed(step))
for step, runs in results.items():
    name = "one transaction" if step == 10**9 else f"steps of {step}"
    total = statistics.median(r[0] for r in runs)
    longest = statistics.median(r[1] for r in runs)
    print(f"{name:>16}: {total * 1e3:6.0f} ms in all, longest transaction {longest * 1e3:6.1f} ms")
