"""A remote engine: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama-server,
`merlin-cli serve`), used by the app's worker beside the local engine. Qt-free.

`RemoteBackend.respond(turns, options, cancel)` streams one answer and yields the same plain
events as the local engine (engine.generate): PrefillDone when the first token arrives
(prefill_ms = time to first token), Tokens per streamed chunk, and once the usage chunk is
in, a second PrefillDone with the prompt tokens the server computed and the ones it had cached,
then Finished. A remote server sends text, not token ids: each chunk's Tokens carries one
placeholder id (-1) so that token counts and tokens/s work as for the local engine (vLLM and
llama-server send one chunk per token), and a default StepProfile: the GEMM/attention split,
bandwidth and speculative statistics are not measurable remotely (the panel says so).

Failures never raise out of respond() once the request is sent: a network error, a timeout,
401/403, 404, 429, 5xx, an error object in the stream or a connection dropped mid-answer end
with Finished("error") whose totals keep the text so far and whose notices say what happened.
Cancellation (the Stop button) closes the response from a watcher thread, so it works even
while the server is silent; the answer so far is kept (reason "cancelled").

Images go as data: URLs, scaled down to the pixel budget (options.max_pixels, else
DEFAULT_MAX_PIXELS) so a photo does not become a 20 MB request.

The API key is kept in a file of its own in the data folder (mode 0600), never in the chats
database nor in settings.ini (which holds the URL and model name).

httpx is the HTTP client: well kept, streaming responses with per-phase timeouts, HTTP/1.1
keep-alive, and exceptions that tell a refused connection from a timeout from a dropped
stream, which is what the messages here need; the standard library's urllib has no streaming
timeouts per read and folds most of these into one URLError.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from merlin.engine.errors import MerlinError
from merlin.engine.generate import Finished, PrefillDone, Tokens
from merlin.engine.profile import StepProfile

REMOTE_SOURCE = "remote"
DEFAULT_MAX_PIXELS = 1024 * 1024
MAX_IMAGE_BYTES = 16 * 1024 * 1024
KEY_FILE = "remote-api-key"
LIST_TIMEOUT = 15.0  # s a server may take to list its models (it has nothing to compute)
MAX_LIST_BYTES = 16 << 20  # a model list (OpenRouter's, hundreds of models, is ~1 MB)


class RemoteError(MerlinError):
    """A message for the user: why the server could not be used."""


@dataclass(frozen=True)
class RemoteConfig:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    api_key: str = ""
    model: str = ""
    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # between two chunks (a big model's prefill can be long)

    @property
    def url(self) -> str:
        return normalize_url(self.base_url)

    @property
    def shown_url(self) -> str:
        """The address as messages and the panel show it: a password in it left out."""
        return re.sub(r"//[^/@]*@", "//", self.url)


def normalize_url(url: str) -> str:
    """'localhost:8000' -> 'http://localhost:8000/v1'; a URL ending in /v1 is kept."""
    url = (url or "").strip().rstrip("/")
    for endpoint in ("/chat/completions", "/completions", "/models"):  # pasted whole
        if url.endswith(endpoint):
            url = url[: -len(endpoint)].rstrip("/")
    if not url:
        raise RemoteError("give the server's address, e.g. http://127.0.0.1:8000/v1.")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise RemoteError(f"{url}: the address must start with http:// or https://.")
    if not url.endswith("/v1") and "/v1/" not in url + "/":
        url += "/v1"
    import httpx

    try:
        host = httpx.URL(url).host
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise RemoteError(f"{url} is not an address a client can use ({e}).") from None
    if not host:
        raise RemoteError(f"{url} names no server.")
    return url


def check_api_key(key: str) -> str:
    """The key, or RemoteError: an HTTP header carries printable ASCII only."""
    if key and not (key.isascii() and key.isprintable()):
        raise RemoteError(
            "the API key has characters an HTTP header cannot carry (only printable ASCII); "
            "paste the key exactly as the server gave it."
        )
    return key


def _headers(key: str) -> dict:
    return {"Authorization": f"Bearer {check_api_key(key)}"} if key else {}


def waited(work, cancel: threading.Event | None, seconds: float):
    """work() on a thread of its own, waited for at most `seconds` and until `cancel` is set:
    (True, its result) or (False, None) when cancelled or out of time; its exception is
    raised here. A blocking request then ends on its own timeouts, unwatched (a server that
    trickles a byte a second, or stays silent, had held a load that could not be cancelled)."""
    box: dict = {}
    finished = threading.Event()

    def run():
        try:
            box["value"] = work()
        except BaseException as e:  # raised in the waiting thread
            box["error"] = e
        finally:
            finished.set()

    threading.Thread(target=run, daemon=True, name="merlin-remote-wait").start()
    deadline = time.monotonic() + seconds
    while not finished.wait(0.05):
        if (cancel is not None and cancel.is_set()) or time.monotonic() > deadline:
            return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("value")


def _timeout(config: RemoteConfig):
    import httpx

    return httpx.Timeout(config.read_timeout, connect=config.connect_timeout)


def _status_message(status: int, body: str, api_key: str, headers=None) -> str:
    detail = ""
    try:
        obj = json.loads(body)
        err = obj.get("error")
        detail = err.get("message", "") if isinstance(err, dict) else str(err or "")
        # vLLM's {"object": "error", "message": ...}, FastAPI's {"detail": ...}
        detail = detail or str(obj.get("message") or obj.get("detail") or "")
    except (ValueError, AttributeError):
        detail = _plain(body)
    detail = f" ({detail[:300]})" if detail else ""
    if 300 <= status < 400:
        where = (headers or {}).get("location") or "another address"
        return f"the server sends the request to {where} ({status}): use that address."
    if status in (401, 403) and not api_key:
        return f"the server needs an API key ({status}){detail}. Enter it in Load a model."
    if status in (401, 403):
        return f"the server refused the API key ({status}){detail}. Check the key in Load a model."
    if status == 404:
        return (
            f"the server has no such model or endpoint (404){detail}. Check the address and model."
        )
    if status == 429:
        retry = str((headers or {}).get("retry-after") or "").strip()
        when = f"; try again in {retry} s" if retry.isdigit() else "; try again shortly"
        return f"the server is busy (429){detail}{when}."
    if status >= 500:
        return f"the server failed ({status}){detail}."
    return f"the server refused the request ({status}){detail}."


def _plain(body: str) -> str:
    """An error body as a line of text: a web page's title (or its text without tags)."""
    title = re.search(r"<title[^>]*>(.*?)</title>", body, re.I | re.S)
    text = title.group(1) if title else re.sub(r"<[^>]*>", " ", body)
    return " ".join(html.unescape(text).split())[:300]


def _network_message(e: Exception, url: str, config: RemoteConfig) -> str:
    import httpx

    if isinstance(e, httpx.ConnectTimeout):
        return f"{url} did not accept the connection within {config.connect_timeout:g} s."
    if isinstance(e, httpx.ConnectError):
        return f"cannot connect to {url} ({e}). Is the server running, and is the address right?"
    if isinstance(e, httpx.ReadTimeout):
        return f"the server sent nothing for {config.read_timeout:g} s; the answer so far is kept."
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
        return (
            "the server closed the connection in the middle of the answer; the answer so far "
            "is kept."
        )
    return f"the connection to {url} failed ({type(e).__name__}: {e})."


def list_models(config: RemoteConfig, within: float = LIST_TIMEOUT) -> list[str]:
    """The model ids the server offers (GET /v1/models); RemoteError with a message if not.
    The whole list must arrive within `within` seconds and MAX_LIST_BYTES: a server that
    trickles its reply (each byte restarting the read timeout) or sends without end is cut
    off then, so the thread asking (remote.waited's) ends too."""
    import httpx

    url = config.shown_url  # in messages; the request goes to config.url
    timeout = httpx.Timeout(min(config.read_timeout, within), connect=config.connect_timeout)
    end = time.monotonic() + within
    body = bytearray()
    try:
        with httpx.stream(
            "GET", config.url + "/models", headers=_headers(config.api_key), timeout=timeout
        ) as r:
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_LIST_BYTES:
                    raise RemoteError(f"{url}/models sent more than {MAX_LIST_BYTES:,} bytes.")
                if time.monotonic() > end:
                    raise RemoteError(
                        f"{url} did not finish sending its model list within {within:g} s."
                    )
    except httpx.ReadTimeout:
        raise RemoteError(
            f"{url} accepted the connection but sent no model list within "
            f"{timeout.read:g} s. Is it an OpenAI-compatible server, and is it busy?"
        ) from None
    except httpx.HTTPError as e:
        raise RemoteError(_network_message(e, url, config)) from None
    text = body.decode("utf-8", "replace")
    if r.status_code != 200:
        raise RemoteError(_status_message(r.status_code, text, config.api_key, r.headers))
    try:
        data = json.loads(text)["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        raise RemoteError(
            f"{url}/models did not answer like an OpenAI-compatible server."
        ) from None


# ---- API key storage ------------------------------------------------------------------------


def key_path(folder: Path) -> Path:
    return Path(folder) / KEY_FILE


def load_api_key(folder: Path) -> str:
    try:
        return key_path(folder).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def save_api_key(folder: Path, key: str) -> None:
    """Write (or with an empty key, delete) the key file, readable by this user only."""
    path = key_path(folder)
    if not key:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key)
    os.replace(tmp, path)


# ---- images ---------------------------------------------------------------------------------


def image_data_url(path: str, max_pixels: int | None = None) -> str:
    """An image file -> a data: URL, scaled down to max_pixels (aspect kept)."""
    from PIL import Image

    from merlin.engine.vision.image_file import open_image, to_rgb

    budget = max_pixels or DEFAULT_MAX_PIXELS
    image = to_rgb(open_image(path), path)
    w, h = image.size
    if w * h > budget:
        scale = (budget / (w * h)) ** 0.5
        image = image.resize((max(1, int(w * scale)), max(1, int(h * scale))), Image.BICUBIC)
    buf = io.BytesIO()
    image.save(buf, "PNG", optimize=False)
    mime = "image/png"
    if buf.tell() > 2 * 1024 * 1024:  # a photo: JPEG is a tenth of the size
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90)
        mime = "image/jpeg"
    if buf.tell() > MAX_IMAGE_BYTES:
        raise RemoteError(f"{path}: the image is too large to send; lower the image max pixels.")
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def chat_messages(
    turns, system: str = "", max_pixels: int | None = None, cancel: threading.Event | None = None
) -> list[dict]:
    """The app's turns (prompting.Turn) -> OpenAI messages; images first, as Merlin renders.
    A set `cancel` ends the pictures' encoding (seconds for a chat of photos): _Stopped."""
    out = [{"role": "system", "content": system}] if system else []
    for t in turns:
        if t.role == "user" and t.images:
            parts = []
            for p in t.images:
                if cancel is not None and cancel.is_set():
                    raise _Stopped
                parts.append(
                    {"type": "image_url", "image_url": {"url": image_data_url(p, max_pixels)}}
                )
            parts.append({"type": "text", "text": t.text})
            out.append({"role": "user", "content": parts})
        else:
            out.append({"role": t.role, "content": t.text})
    return out


# ---- answering ------------------------------------------------------------------------------


def _whole_answer(body: bytes) -> tuple[str, str, str | None, dict | None]:
    """(text, reasoning, finish reason, usage) of a whole chat.completion body; ValueError
    when it is not one."""
    obj = json.loads(body)
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("not a chat completion")
    message = choices[0].get("message")
    message = message if isinstance(message, dict) else {}
    reason = choices[0].get("finish_reason")
    usage = obj.get("usage")
    return (
        _text_of(message.get("content")),
        _text_of(message.get("reasoning_content")),
        reason if isinstance(reason, str) else None,
        _counts(usage) if isinstance(usage, dict) else None,
    )


def _text_of(value) -> str:
    """A delta's text: a string, or the text of a list of content parts; else nothing."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _counts(usage: dict) -> dict:
    """A usage object with only whole numbers where it gives counts (a server's odd values
    dropped, not raised)."""

    def whole(v):
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    out = {k: whole(usage.get(k)) for k in ("prompt_tokens", "completion_tokens")}
    details = usage.get("prompt_tokens_details")
    cached = whole(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return {k: v for k, v in out.items() if v is not None}


def _interrupt(response) -> None:
    """Wake a thread blocked reading `response`: closing a socket does not interrupt a recv()
    in another thread on Linux, shutting it down does."""
    _shut_down(response.extensions.get("network_stream"))


def _shut_down(stream) -> None:
    """Shut down the socket under an httpcore network stream (None: nothing to do)."""
    import socket

    try:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


MAX_EVENT_BYTES = 16 << 20  # one streamed event, an error body or a whole answer


def _read_at_most(response, limit: int) -> bytes:
    """The response's body; RemoteError past `limit` bytes (a server sending without end)."""
    data = bytearray()
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > limit:
            raise RemoteError(f"the server sent more than {limit >> 20} MB where one answer goes.")
    return bytes(data)


def _lines(response, limit: int) -> Iterator[str]:
    """The response's lines (LF, CRLF or CR ends, as SSE allows), decoded leniently; a line
    longer than `limit` bytes ends the stream with RemoteError (it had grown without end)."""
    rest = b""
    for chunk in response.iter_bytes():
        held_cr = rest.endswith(b"\r")  # a line end, unless the chunk starts with its \n
        rest += chunk
        if b"\n" not in chunk and b"\r" not in chunk and not held_cr:  # no rescan of rest
            if len(rest) > limit:
                raise RemoteError(f"the server sent an event of more than {limit >> 20} MB.")
            continue
        *done, rest = re.split(rb"\r\n|\n|\r(?!$)", rest)
        for line in done:
            yield line.decode("utf-8", "replace")
        if len(rest) > limit:
            raise RemoteError(f"the server sent an event of more than {limit >> 20} MB.")
    if rest:
        yield rest.rstrip(b"\r").decode("utf-8", "replace")


def _about_images(body: str) -> bool:
    return bool(re.search(r"image|vision|multimodal|picture", body, re.I))


class _Stopped(Exception):
    """Stop was pressed while the request was being made."""


class _PicturesRefused(Exception):
    """The server refused a request with pictures for them (a model without vision)."""


class RemoteBackend:
    def __init__(self, config: RemoteConfig):
        self.config = config

    def request_body(self, turns, options, cancel: threading.Event | None = None) -> dict:
        messages = chat_messages(turns, options.system_prompt, options.max_pixels or None, cancel)
        body = {
            "model": self.config.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max(1, int(options.max_new_tokens)),
        }
        if options.sampling:  # None: the server's (the model's) defaults
            for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed"):
                if options.sampling.get(k) is not None:
                    body[k] = options.sampling[k]
        return body

    @staticmethod
    def _whole(body: bytes, state: dict, finished, t0: float) -> Iterator:
        """The events of a whole (not streamed) completion."""
        try:
            text, thought, reason, usage = _whole_answer(body)
        except ValueError:
            try:
                err = json.loads(body).get("error")
                why = err.get("message") if isinstance(err, dict) else str(err or "")
            except (ValueError, AttributeError):
                why = ""
            why = f"the server stopped the answer: {why}" if why else "not a chat completion"
            yield finished("error", f"the server's answer was {why}.")
            return
        now = time.perf_counter()
        state.update(first=now, last=now, chunks=1, usage=usage)
        state["text"].append(text)
        yield PrefillDone(0, 0.0, (now - t0) * 1e3)
        yield Tokens(text, [-1], StepProfile(step=1), thought, 1 if thought else 0)
        yield finished({"length": "max_tokens"}.get(reason or "stop", "stop_token"))

    def respond(self, turns, options, cancel: threading.Event | None = None) -> Iterator:
        """Stream the answer to the last turn (see the module docstring for the events).
        RemoteError before anything is sent (e.g. an unreadable image). A server that
        refuses pictures (a model without vision) is asked again without them, and the
        answer says so (every later turn would fail on them otherwise)."""
        cancel = cancel or threading.Event()
        try:
            yield from self._respond(turns, options, cancel)
        except _PicturesRefused:
            text_only = [replace(t, images=[]) for t in turns]
            notice = "The server does not take pictures; it answered without them."
            yield from self._respond(text_only, options, cancel, notice)

    def _respond(self, turns, options, cancel, notice_at_end: str = "") -> Iterator:
        import httpx

        cfg = self.config
        has_pictures = any(t.images for t in turns)
        t0 = time.perf_counter()
        state = {"text": [], "chunks": 0, "first": None, "last": None, "usage": None}

        def finished(reason: str, notice: str = "") -> Finished:
            text = "".join(state["text"])
            usage = state["usage"] or {}
            n = int(usage.get("completion_tokens") or state["chunks"])
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            first, last = state["first"], state["last"]
            tps = (n - 1) / (last - first) if first and last and last > first and n > 1 else 0.0
            totals = {
                "generated_tokens": n,
                "tokens_per_s": round(tps, 3),
                "text": text,
                "notices": [x for x in (notice, notice_at_end) if x],
                "remote": cfg.shown_url,
            }
            if usage:
                totals["prompt_tokens"] = int(usage.get("prompt_tokens") or 0) - cached
                totals["reused_tokens"] = cached
            if first:
                totals["prefill_ms"] = round((first - t0) * 1e3, 3)
            return Finished.of(reason, totals)

        try:
            body = self.request_body(turns, options, cancel)
        except _Stopped:
            yield finished("cancelled")
            return
        t0 = time.perf_counter()  # the request's time starts once its pictures are encoded
        client = httpx.Client(timeout=_timeout(cfg))
        response = None
        closed_by_cancel = threading.Event()

        done = threading.Event()

        def watch():  # the Stop button closes the stream even while the server is silent
            while not done.is_set():
                if cancel.wait(0.1):
                    closed_by_cancel.set()
                    if response is not None:
                        _interrupt(response)
                    return

        watcher = threading.Thread(target=watch, daemon=True, name="merlin-remote-cancel")
        sent = False
        try:
            streams: list = []  # the connection's stream, once open (httpx's trace hook)

            def trace(event: str, info: dict) -> None:
                if event.endswith("connect_tcp.complete") and info.get("return_value"):
                    streams.append(info["return_value"])

            request = client.build_request(
                "POST",
                cfg.url + "/chat/completions",
                json=body,
                headers=_headers(cfg.api_key),
                extensions={"trace": trace},
            )
            # sent on a thread of its own: Stop ends the wait for the server's first bytes
            # (a busy server answers when it starts on the request)
            try:
                sent, response = waited(
                    lambda: client.send(request, stream=True), cancel, float("inf")
                )
            except httpx.HTTPError as e:
                sent = True
                yield finished("error", _network_message(e, cfg.shown_url, cfg))
                return
            if not sent:  # the server learns at once: the socket is shut down
                for stream in streams:
                    _shut_down(stream)
                yield finished("cancelled")
                return
            watcher.start()
            if response.status_code != 200:
                text = _read_at_most(response, MAX_EVENT_BYTES).decode("utf-8", "replace")
                if has_pictures and response.status_code in (400, 415, 422) and _about_images(text):
                    raise _PicturesRefused
                yield finished(
                    "error",
                    _status_message(response.status_code, text, cfg.api_key, response.headers),
                )
                return
            ctype = response.headers.get("content-type", "").lower()
            if ctype.startswith("text/html"):  # a captive portal, a web UI's fallback page
                yield finished(
                    "error",
                    f"{cfg.shown_url} answered with a web page, not an answer: check the address "
                    "(an OpenAI-compatible server's usually ends in /v1).",
                )
                return
            if ctype.startswith("application/json"):
                # a server that ignores "stream": one whole completion
                try:
                    whole = _read_at_most(response, MAX_EVENT_BYTES)
                except (httpx.HTTPError, httpx.StreamError, OSError, RemoteError) as e:
                    cut = cancel.is_set() or closed_by_cancel.is_set()
                    yield (
                        finished("cancelled")
                        if cut
                        else finished("error", _network_message(e, cfg.shown_url, cfg))
                    )
                    return
                yield from self._whole(whole, state, finished, t0)
                return
            reason, events, other = None, 0, []
            try:
                for line in _lines(response, MAX_EVENT_BYTES):
                    if cancel.is_set():
                        break
                    if not line.startswith("data:"):
                        if not events and sum(map(len, other)) < MAX_EVENT_BYTES:
                            other.append(line)  # a whole answer under another content type?
                        continue
                    events += 1
                    data = line[5:].strip()
                    if data == "[DONE]":
                        reason = reason or "stop"  # the end, whether a choice said so or not
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        continue  # a keep-alive or a comment
                    if not isinstance(obj, dict):
                        continue  # not an event of the API: skipped, as a comment is
                    if obj.get("error"):  # some servers send "error": null in every chunk
                        err = obj["error"]
                        msg = err.get("message") if isinstance(err, dict) else str(err)
                        yield finished("error", f"the server stopped the answer: {msg}")
                        return
                    if isinstance(obj.get("usage"), dict):
                        state["usage"] = _counts(obj["usage"])
                    choices = obj.get("choices")
                    for choice in choices if isinstance(choices, list) else []:
                        if not isinstance(choice, dict):
                            continue
                        d = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                        delta = _text_of(d.get("content"))
                        thought = _text_of(d.get("reasoning_content"))  # a thinking model's
                        if delta or thought:
                            now = time.perf_counter()
                            if state["first"] is None:
                                state["first"] = now
                                yield PrefillDone(0, 0.0, (now - t0) * 1e3)
                            state["last"] = now
                            state["chunks"] += 1
                            state["text"].append(delta)
                            profile = StepProfile(step=state["chunks"])
                            yield Tokens(delta, [-1], profile, thought, 1 if thought else 0)
                            if state["chunks"] > 2 * body["max_tokens"] + 16:  # a chunk: 1+
                                yield finished(
                                    "max_tokens",
                                    "the server did not stop at the answer's token limit; "
                                    "Merlin stopped reading it.",
                                )
                                return
                        if isinstance(choice.get("finish_reason"), str):
                            reason = choice["finish_reason"]
            except (httpx.HTTPError, httpx.StreamError, OSError) as e:
                if cancel.is_set() or closed_by_cancel.is_set():
                    yield finished("cancelled")
                else:
                    yield finished("error", _network_message(e, cfg.shown_url, cfg))
                return
            except RemoteError as e:
                yield finished("error", str(e))
                return
            if cancel.is_set():
                yield finished("cancelled")
                return
            if not events and "".join(other).lstrip().startswith("{"):
                yield from self._whole("\n".join(other).encode(), state, finished, t0)
                return
            if reason is None:
                yield finished(
                    "error",
                    "the server closed the connection before the answer was finished; the "
                    "answer so far is kept.",
                )
                return
            usage = state["usage"]
            if usage:
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                first = state["first"] or time.perf_counter()
                yield PrefillDone(
                    int(usage.get("prompt_tokens") or 0) - cached, 0.0, (first - t0) * 1e3, cached
                )
            yield finished({"length": "max_tokens"}.get(reason, "stop_token"))
        finally:
            done.set()
            if response is not None:
                response.close()
            client.close()  # a send still waiting for its headers ends here
