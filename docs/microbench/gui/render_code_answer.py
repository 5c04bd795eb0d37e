"""Time the final render of a code answer in a shown MessageText, and the GUI thread's share
spent rendering a growing open code block streamed at 30 refreshes a second (docs/robustness.md,
"The GUI thread").

    QT_QPA_PLATFORM=offscreen python docs/microbench/gui/render_code_answer.py
"""

import time

from PySide6.QtWidgets import QApplication

app = QApplication([])

from merlin.app.widgets.message_text import MessageText  # noqa: E402 (after the application)


def final_render(lines: int) -> float:
    code = "Here is the program:\n\n```python\n"
    code += "".join(
        f"def f{i}(x):\n    return x * {i} + len('abc')  # comment\n" for i in range(lines // 2)
    )
    view = MessageText()
    view.resize(700, 100)
    view.show()
    app.processEvents()
    t = time.perf_counter()
    view.render_markdown(code + "```\n")
    return time.perf_counter() - t


def streaming_share(seconds: float = 4.0) -> tuple[float, int]:
    view = MessageText()
    view.resize(700, 100)
    view.show()
    busy = [0.0]
    render = view._render_stream

    def timed(src):
        t = time.perf_counter()
        render(src)
        busy[0] += time.perf_counter() - t

    view._render_stream = timed
    code = "Here:\n\n```python\n" + "".join(f"x{i} = {i} * 2  # step\n" for i in range(1200))
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        n += 1
        view.stream(code[: 2000 + n * 300])
        end = time.perf_counter() + 1 / 30
        while time.perf_counter() < end:
            app.processEvents()
    return busy[0] / (time.perf_counter() - t0), min(len(code), 2000 + n * 300)


for lines in (200, 400, 800):
    print(f"final render of a {lines}-line code answer: {final_render(lines) * 1e3:.0f} ms")
share, size = streaming_share()
print(f"streaming an open code block up to {size // 1000} KB: {100 * share:.0f}% of the GUI thread")
