"""Engine events -> OpenAI chat-completion objects (whole, or as streamed chunks).

Usage follows OpenAI: prompt_tokens (the whole rendered conversation: the rows reused from
the KV cache plus the rows computed), prompt_tokens_details.cached_tokens (the reused ones),
completion_tokens, total_tokens. The `merlin` field, an extension that OpenAI clients ignore,
carries what only Merlin measures: prefill/vision/decode time, tokens per second, the step
profile totals (gemm/attention/other ms summed over the decode forwards, bytes read) and the
speculative-decoding statistics.
"""

from __future__ import annotations

import json
import time
import uuid

# engine finish reasons -> OpenAI's
FINISH = {
    "stop_token": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
    "error": "stop",
}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def usage(totals: dict) -> dict:
    computed = int(totals.get("prompt_tokens", 0))
    cached = int(totals.get("reused_tokens", 0))
    completion = int(totals.get("generated_tokens", 0))
    return {
        "prompt_tokens": computed + cached,
        "completion_tokens": completion,
        "total_tokens": computed + cached + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def merlin_stats(reason: str, totals: dict, ttft_ms: float | None = None) -> dict:
    out = {
        "finish_reason": reason,
        "prefill_ms": totals.get("prefill_ms", 0.0),
        "vision_ms": totals.get("vision_ms", 0.0),
        "decode_ms": totals.get("decode_ms", 0.0),
        "tokens_per_s": totals.get("tokens_per_s", 0.0),
        "engine_ttft_ms": totals.get("engine_ttft_ms"),
        "engine_tokens_per_s": totals.get("engine_tokens_per_s"),
        "context_tokens": totals.get("context_tokens", 0),
        "profile": totals.get("profile", {}),
        "spec": totals.get("spec", {}),
        "notices": totals.get("notices", []),
        "dropped_messages": totals.get("dropped_messages", []),
    }
    if ttft_ms is not None:
        out["time_to_first_token_ms"] = round(ttft_ms, 3)
    return out


def completion(
    cid: str, model: str, created: int, text: str, reason: str, totals: dict, reasoning=None
) -> dict:
    message = {"role": "assistant", "content": text}
    if reasoning is not None:  # a thinking model's (the field DeepSeek and vLLM use)
        message["reasoning_content"] = reasoning
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": FINISH.get(reason, "stop"),
                "logprobs": None,
            }
        ],
        "usage": usage(totals),
        "merlin": merlin_stats(reason, totals),
    }


def chunk(
    cid: str, model: str, created: int, delta: dict, finish: str | None = None, usage=False
) -> dict:
    """A stream chunk; usage=True: it carries "usage": null, as OpenAI's chunks do when the
    request asked for include_usage (the usage itself comes in usage_chunk)."""
    out = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if usage:
        out["usage"] = None
    return out


def usage_chunk(cid: str, model: str, created: int, reason: str, totals: dict, ttft_ms) -> dict:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(totals),
        "merlin": merlin_stats(reason, totals, ttft_ms),
    }


def sse(obj) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def now() -> int:
    return int(time.time())
