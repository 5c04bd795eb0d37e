"""A local stand-in for the Hugging Face hub's HTTP API (what huggingface_hub's model_info
and file downloads ask for), serving files from a dict, on 127.0.0.1 only.

Faults for tests: `drop_after[name] = n` closes the next transfer of a file after n bytes (an
interrupted download); `down = True` answers 503 to every file request (the network or the
server is gone; `down_after_drop` sets it when a transfer is dropped); `corrupt.add(name)`
serves other bytes than the published sha256; `slow = True` sends files at ~1 MB/s;
`error_page.add(name)` answers that file's HEAD and GET with a web page (200, text/html), as
a misconfigured mirror does (`error_page.add("api")`: the model listing too); `sizes = False`
leaves the sizes out of the listing."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo_id: str, files: dict[str, bytes]):
        self.repo_id = repo_id
        self.files = files
        self.drop_after: dict[str, int] = {}
        self.down = False
        self.down_after_drop = False
        self.slow = False
        self.corrupt: set[str] = set()
        self.error_page: set[str] = set()
        self.sizes = True
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):  # noqa: N802
                hub._serve(self, head=True)

            def do_GET(self):  # noqa: N802
                hub._serve(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(".safetensors")

    def _info(self) -> dict:
        siblings = []
        for name, data in self.files.items():
            s = {"rfilename": name, "blobId": hashlib.sha1(data).hexdigest()}
            if self.sizes:
                s["size"] = len(data)
            if self.is_lfs(name):
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}  # fmt: skip
            siblings.append(s)
        return {"id": self.repo_id, "modelId": self.repo_id, "sha": COMMIT, "private": False,
                "siblings": siblings}  # fmt: skip

    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?")[0]
        self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
        repo = re.escape(self.repo_id)
        if path.startswith("/api/") and "api" in self.error_page:
            page = b"<html><body>Mirror error: try again later</body></html>"
            return self._reply(h, 200, page, {"Content-Type": "text/html"}, head)
        if re.fullmatch(rf"/api/models/{repo}(/revision/[^/]+)?", path):
            body = json.dumps(self._info()).encode()
            return self._reply(h, 200, body, {"Content-Type": "application/json"}, head)
        if path.startswith("/api/models/"):
            return self._reply(h, 401, b'{"error": "Repository Not Found"}',
                               {"X-Error-Code": "RepositoryNotFound"}, head)  # fmt: skip
        m = re.fullmatch(rf"/{repo}/resolve/[^/]+/(.+)", path)
        if not m or m.group(1) not in self.files:
            return self._reply(h, 404, b'{"error": "Entry not found"}',
                               {"X-Error-Code": "EntryNotFound"}, head)  # fmt: skip
        name = m.group(1)
        if name in self.error_page:
            page = b"<html><body>Mirror error: try again later</body></html>"
            return self._reply(h, 200, page, {"Content-Type": "text/html"}, head)
        if self.down:
            return self._reply(h, 503, b"Service Unavailable", {}, head)
        data = self.files[name]
        etag = (
            hashlib.sha256(data).hexdigest()
            if self.is_lfs(name)
            else hashlib.sha1(data).hexdigest()
        )
        if name in self.corrupt:
            data = bytes(b ^ 0xFF for b in data)
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if self.is_lfs(name):
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(len(data))
        start = 0
        rng = h.headers.get("Range")
        if rng and not head:
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if not head and name in self.drop_after:
            cut = self.drop_after.pop(name)
            self.down = self.down_after_drop
            headers["Content-Length"] = str(len(body))
            h.send_response(206 if start else 200)
            for k, v in headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            return
        self._reply(h, 206 if start else 200, body, headers, head)

    def _reply(self, h, code: int, body: bytes, headers: dict, head: bool) -> None:
        h.send_response(code)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if head:
            return
        step = 64 << 10 if self.slow else len(body) or 1
        for i in range(0, len(body), step):
            h.wfile.write(body[i : i + step])
            if self.slow:
                time.sleep(0.06)
