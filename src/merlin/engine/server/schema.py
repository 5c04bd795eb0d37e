"""A chat-completions request body (parsed JSON) -> a checked ChatRequest, or ApiError.

Follows the OpenAI chat-completions format: `messages` with roles system/developer, user and
assistant; `content` a string or a list of parts `{"type": "text"}` and `{"type": "image_url"}`;
`max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `stop`, `seed`, `n` (only 1),
`stream` with `stream_options.include_usage`; and the extensions that vLLM and llama-server
accept too (`top_k`, `min_p`, `repetition_penalty`, vLLM's `ignore_eos`). Every check names
the field it refuses (ApiError.param), and every bound is in Limits so one place says what a
request may cost: the number of messages, characters, images, stop strings and answer tokens.

What the engine cannot do is refused, not ignored: `n` > 1, tools, logprobs, a JSON response
format, and presence/frequency penalties other than 0 (the engine has the multiplicative
repetition penalty, not the additive OpenAI ones). Unknown fields are ignored, as OpenAI-
compatible servers do, because clients send many (`user`, `metadata`, ...).

Layout of a message: its parts keep their order, as the reference chat template renders a
content list: the text parts are joined as they are (the template writes them one after the
other) and each image is placed at its offset in that text (ChatMessage.image_offsets), so
[text, image] asks about a picture that follows the question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import InputError
from ..prompt import MAX_MESSAGE_CHARS, check_user_text, sanitize_user_text
from .errors import ApiError


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 1024 * 1024  # a request body (data: URL images included)
    max_image_bytes: int = 20 * 1024 * 1024  # one image, decoded
    max_images: int = 16  # per request
    max_messages: int = 512
    max_stop: int = 4  # stop strings, as OpenAI
    max_stop_chars: int = 256
    max_tokens: int | None = None  # answer tokens (None: the context budget)


@dataclass
class ImageRef:
    url: str  # a data: URL, a file: URL or a path
    param: str  # the field it came from, for errors


@dataclass
class ChatMessage:
    role: str  # "user" | "assistant"
    text: str
    images: list[ImageRef] = field(default_factory=list)
    reasoning: str | None = None  # an assistant message's reasoning_content (thinking models)
    image_offsets: tuple[int, ...] = ()  # each image's place in text (Message.image_offsets)


@dataclass
class ChatRequest:
    messages: list[ChatMessage]  # without the system prompt; ends with a user message
    system: str = ""
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None  # None: the server's default
    sampling: dict = field(default_factory=dict)  # SamplingParams fields given by the client
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # vLLM's extension: keep generating past end-of-sequence tokens
    raw_messages: int = 0  # messages in the body, system ones included


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
UNSUPPORTED = {
    "tools": "tool calls are not supported by Merlin's server; send plain messages.",
    "functions": "function calls are not supported by Merlin's server; send plain messages.",
    "logit_bias": "token biases are not supported by Merlin's server; leave it out.",
}


def _type_name(v) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(v), "null" if v is None else "a number"
    )


def _shown(v) -> str:
    """A number for an error message: a JSON integer may have thousands of digits."""
    return str(v) if isinstance(v, float) or abs(v) < 10**20 else "a number too large to use"


def _number(body: dict, key: str, lo: float, hi: float, *, integer: bool = False):
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise ApiError(f"'{key}' must be {kind}, got {_type_name(v)}.", key)
    # an int is compared exactly: math.isfinite would convert it to float, which overflows
    finite = isinstance(v, int) or math.isfinite(v)
    if not finite or not lo <= v <= hi:
        raise ApiError(f"'{key}' must be between {lo:g} and {hi:g}, got {_shown(v)}.", key)
    return v


def _bool(body: dict, key: str, default: bool = False, *, parent: str = "") -> bool:
    """body[key] as a bool; `parent` ("stream_options.") prefixes the field's name in errors."""
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        param = parent + key
        raise ApiError(f"'{param}' must be true or false, got {_type_name(v)}.", param)
    return v


def _text(v, param: str) -> str:
    """A message text -> str the tokenizer can encode (too long: ApiError)."""
    try:
        return check_user_text(v)
    except InputError as e:
        raise ApiError(str(e), param) from None


def parse_content(
    content, i: int, role: str, limits: Limits
) -> tuple[str, list[ImageRef], tuple[int, ...]]:
    """A message's content -> (its text, its images, each image's offset in the text)."""
    param = f"messages[{i}].content"
    if content is None:
        if role == "assistant":
            return "", [], ()
        raise ApiError(f"'{param}' is missing; give the message text.", param)
    if isinstance(content, str):
        return _text(content, param), [], ()
    if not isinstance(content, list):
        raise ApiError(
            f"'{param}' must be a string or an array of content parts, got {_type_name(content)}.",
            param,
        )
    texts, images, offsets = [], [], []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise ApiError(f"'{p}' must be an object, got {_type_name(part)}.", p)
        kind = part.get("type")
        if kind == "text":
            t = part.get("text")
            if not isinstance(t, str):
                raise ApiError(f"'{p}.text' must be a string, got {_type_name(t)}.", f"{p}.text")
            texts.append(sanitize_user_text(t))
        elif kind == "image_url":
            if role != "user":
                raise ApiError(f"'{p}': only user messages can have images.", p)
            url = part.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            if not isinstance(url, str) or not url:
                raise ApiError(
                    f"'{p}.image_url.url' must be a string (a data: URL or a file path), "
                    f"got {_type_name(url)}.",
                    f"{p}.image_url.url",
                )
            images.append(ImageRef(url, f"{p}.image_url.url"))
            offsets.append(sum(map(len, texts)))
        else:
            raise ApiError(f"'{p}.type' must be 'text' or 'image_url', got {kind!r}.", f"{p}.type")
    return _text("".join(texts), param), images, tuple(offsets)


def parse_messages(raw, limits: Limits) -> tuple[str, list[ChatMessage]]:
    if raw is None:
        raise ApiError("'messages' is missing; give the conversation as an array.", "messages")
    if not isinstance(raw, list):
        raise ApiError(f"'messages' must be an array, got {_type_name(raw)}.", "messages")
    if not raw:
        raise ApiError("'messages' is empty; give at least one user message.", "messages")
    if len(raw) > limits.max_messages:
        raise ApiError(
            f"'messages' has {len(raw)} messages; this server accepts at most "
            f"{limits.max_messages}. Send the recent part of the conversation.",
            "messages",
        )
    system: list[str] = []
    out: list[ChatMessage] = []
    n_images = 0
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ApiError(
                f"'messages[{i}]' must be an object, got {_type_name(m)}.", f"messages[{i}]"
            )
        role = m.get("role")
        p = f"messages[{i}].role"
        if not isinstance(role, str):
            raise ApiError(f"'{p}' must be a string, got {_type_name(role)}.", p)
        if role in ("tool", "function"):
            raise ApiError(f"'{p}': role '{role}' is not supported (no tool calls).", p)
        if role not in ("system", "developer", "user", "assistant"):
            raise ApiError(
                f"'{p}' must be 'system', 'developer', 'user' or 'assistant', got {role!r}.", p
            )
        if m.get("tool_calls"):
            raise ApiError(
                f"'messages[{i}].tool_calls': tool calls are not supported.",
                f"messages[{i}].tool_calls",
            )
        text, images, offsets = parse_content(m.get("content"), i, role, limits)
        if role in ("system", "developer"):
            if out:
                raise ApiError(
                    f"'messages[{i}]': a {role} message must come before the conversation "
                    "(the chat template has one system prompt, at the start).",
                    f"messages[{i}]",
                )
            if images:
                raise ApiError(f"'messages[{i}]': a system message cannot have images.", p)
            system.append(text)
            continue
        n_images += len(images)
        if n_images > limits.max_images:
            raise ApiError(
                f"the request has more than {limits.max_images} images; send fewer.",
                f"messages[{i}].content",
            )
        reasoning = m.get("reasoning_content")
        if reasoning is not None and (role != "assistant" or not isinstance(reasoning, str)):
            raise ApiError(
                f"'messages[{i}].reasoning_content' must be a string, on an assistant message.",
                f"messages[{i}].reasoning_content",
            )
        out.append(ChatMessage(role, text, images, reasoning, offsets))
    if not out or out[-1].role != "user":
        raise ApiError(
            "the last message must be a user message: the server answers it.", "messages"
        )
    if not out[-1].text.strip() and not out[-1].images:
        raise ApiError(
            f"'messages[{len(raw) - 1}].content' is empty; give a question.",
            f"messages[{len(raw) - 1}].content",
        )
    joined = "\n\n".join(system)
    if len(joined) > MAX_MESSAGE_CHARS:  # one system prompt: the limit of one message
        raise ApiError(
            f"the system messages together are {len(joined):,} characters; the system prompt "
            f"may be at most {MAX_MESSAGE_CHARS:,}. Shorten or drop some of them.",
            "messages",
        )
    return joined, out


def parse_stop(v, limits: Limits) -> list[str]:
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("'stop' must be a string or an array of strings.", "stop")
    stops = [s for s in stops if s]
    if len(stops) > limits.max_stop:
        raise ApiError(f"'stop' may hold at most {limits.max_stop} strings.", "stop")
    if any(len(s) > limits.max_stop_chars for s in stops):
        raise ApiError(
            f"each 'stop' string may be at most {limits.max_stop_chars} characters.", "stop"
        )
    return stops


def parse_request(body, limits: Limits, context_budget: int) -> ChatRequest:
    """The JSON body of POST /v1/chat/completions -> ChatRequest (ApiError naming the field)."""
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {_type_name(body)}.", None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(f"'model' must be a string, got {_type_name(model)}.", "model")
    for key, why in UNSUPPORTED.items():
        if body.get(key):
            raise ApiError(f"'{key}': {why}", key)
    if body.get("tool_choice") not in (None, "none"):
        raise ApiError("'tool_choice': tool calls are not supported.", "tool_choice")
    if _bool(body, "logprobs") or body.get("top_logprobs"):
        raise ApiError("'logprobs' is not supported by Merlin's server.", "logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError(
            '\'response_format\': only {"type": "text"} is supported.', "response_format"
        )
    n = _number(body, "n", 1, 1 << 30, integer=True)
    if n not in (None, 1):
        raise ApiError("'n' must be 1: Merlin's server gives one answer per request.", "n")
    for key in ("presence_penalty", "frequency_penalty"):
        v = _number(body, key, -2.0, 2.0)
        if v:
            raise ApiError(
                f"'{key}' other than 0 is not supported; use 'repetition_penalty' "
                "(1.0 = off, e.g. 1.1) instead.",
                key,
            )
    system, messages = parse_messages(body.get("messages"), limits)
    cap = min(limits.max_tokens or context_budget, context_budget)
    max_tokens = None
    for key in ("max_completion_tokens", "max_tokens"):
        v = _number(body, key, 1, float("inf"), integer=True)
        if v is not None:
            if v > cap:
                raise ApiError(
                    f"'{key}' is {_shown(v)}; this server allows at most {cap} answer tokens.",
                    key,
                )
            max_tokens = v if max_tokens is None else max_tokens
    sampling = {}
    for key, lo, hi, integer in (
        ("temperature", 0.0, 100.0, False),
        ("top_p", 0.0, 1.0, False),
        ("top_k", -1, 1 << 31, True),
        ("min_p", 0.0, 1.0, False),
        ("repetition_penalty", 0.0, 100.0, False),
        ("seed", -(1 << 63), (1 << 64) - 1, True),
    ):
        v = _number(body, key, lo, hi, integer=integer)
        if v is None:
            continue
        if key == "top_p" and v == 0:
            raise ApiError("'top_p' must be greater than 0.", key)
        if key == "min_p" and v >= 1:
            raise ApiError("'min_p' must be below 1.", key)
        if key == "repetition_penalty" and v <= 0:
            raise ApiError("'repetition_penalty' must be positive (1.0 = off).", key)
        if key == "top_k" and v < 0:
            v = 0  # -1 (vLLM, llama-server): no top-k
        if key == "seed" and v < 0:
            v &= (1 << 64) - 1  # numpy seeds are non-negative
        sampling[key] = float(v) if not integer else int(v)
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise ApiError("'stream_options' must be an object.", "stream_options")
        include_usage = _bool(opts, "include_usage", parent="stream_options.")
    return ChatRequest(
        messages=messages,
        system=system,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=parse_stop(body.get("stop"), limits),
        ignore_eos=_bool(body, "ignore_eos"),
        raw_messages=len(body["messages"]),
    )
