"""`merlin-cli serve` in a child process on a free loopback port (tests, the serve benchmark).

Starts `python -m merlin.engine.cli serve --port 0 ARGS`, waits for its "listening on URL"
line (kernels may compile first), and keeps reading its output so the child never blocks on a
full pipe. stop() terminates it (then kills it if it does not end).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request


class ServerProcess:
    def __init__(self, *args: str, env_extra: dict | None = None, timeout: float = 900):
        env = dict(os.environ, PYTHONIOENCODING="utf-8", **(env_extra or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "merlin.engine.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.stderr: list[str] = []
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout, lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        self.url = None
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            m = re.search(r"listening on (http://\S+/v1)", line or "")
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.stop()
            raise RuntimeError("merlin-cli serve did not start:\n" + "".join(self.stderr))
        assert self.url.startswith("http://127.0.0.1:")
        self.root = self.url[: -len("/v1")]

    @staticmethod
    def _pump(stream, lines) -> None:
        for line in stream:
            lines.put(line)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    def health(self) -> dict:
        with urllib.request.urlopen(self.root + "/health", timeout=10) as r:
            return json.loads(r.read())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def stream_interrupted(url: str, max_tokens: int, interrupt, after_lines: int = 20):
    """Stream a long greedy answer from the server at `url` (its /v1), calling interrupt()
    once `after_lines` lines have come (stop the server, signal it); read on until the
    stream ends. Returns (raw lines, the parsed `data: {...}` events)."""
    import httpx

    body = {
        "messages": [{"role": "user", "content": "Go on and on."}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    lines: list[str] = []
    try:
        with httpx.stream("POST", url + "/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == after_lines:
                    interrupt()
    except httpx.HTTPError:
        pass  # the connection may also just close
    return lines, [json.loads(x[5:]) for x in lines if x.startswith("data: {")]
