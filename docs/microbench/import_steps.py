"""An import of 20,000 messages (20 chats of 1,000, ~300 characters each) on a writing
connection of its own (Store.writer, on a thread, as the app runs it) while this thread saves
a message every 20 ms, as a streamed answer does: the import's time, and the longest and the
median wait of those saves. In one transaction against steps of store_import.IMPORT_STEP
messages (docs/robustness.md, "The GUI thread"). Alternating, 3 rounds, medians.

    python docs/microbench/import_steps.py
"""

import statistics
import tempfile
import threading
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
        store = Store(folder)
        own = store.create_conversation("the window's chat")
        writer = store.writer()
        data = chats()
        job = threading.Thread(target=lambda: writer.add_conversations(data, step=step))
        t0 = time.perf_counter()
        job.start()
        waits = []
        while job.is_alive():
            t = time.perf_counter()
            store.add_message(own, "assistant", "a streamed answer's save")
            waits.append(time.perf_counter() - t)
            time.sleep(0.02)
        job.join()
        total = time.perf_counter() - t0
        writer.close()
        store.close()
        return total, max(waits), statistics.median(waits)


results = {}
for _ in range(3):
    for step in (10**9, store_import.IMPORT_STEP):
        results.setdefault(step, []).append(timed(step))
for step, runs in results.items():
    name = "one transaction" if step == 10**9 else f"steps of {step}"
    total, longest, median = (statistics.median(r[i] for r in runs) for i in range(3))
    print(
        f"{name:>16}: import {total * 1e3:5.0f} ms; a save waits {longest * 1e3:6.1f} ms at "
        f"most, {median * 1e3:5.1f} ms median"
    )
