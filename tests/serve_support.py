"""`merlin-cli serve` in a subprocess on a free loopback port, for the server and app tests."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time

import httpx


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
        return httpx.get(self.root + "/health", timeout=10).json()

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
