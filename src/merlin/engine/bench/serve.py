"""Server figures for `python -m merlin.engine.bench serve`: what the HTTP layer costs.

The same greedy request (one user question, `answer_tokens` answer tokens, end-of-sequence
ignored, speculative decoding off so both sides do identical work) is answered twice per round
in the same run: in-process through engine.server's EngineAdapter (what the server runs inside),
and through `merlin-cli serve` in a child process, streamed over loopback HTTP with httpx and
read chunk by chunk as a client does. Each round uses a new question, so both sides prefill
the same fresh prompt; the two orders alternate from round to round so that drift on a shared
host falls on both. Per side, medians over rounds:

- time to first token: from sending the request (in-process: calling start(), on a thread
  like the server's generation thread) to the first token's text;
- decode tokens/s: completion tokens after the first / time from the first to the last token.

Reported: server overhead = TTFT(http) - TTFT(in-process) in ms (target <= 20 ms) and the
decode throughput lost, 1 - tok/s(http) / tok/s(in-process) (target <= 3%). On a busy shared
host the two sides' rounds differ by more than the HTTP layer costs, so the same two figures
are also given paired: each HTTP request against the server's own engine timing of that very
request (the `merlin` usage field: start() to the first text, and text tokens/s after it, in
the generation thread), which leaves only what lies between the engine and the client
(thread handoff, event loop, SSE, loopback, the client's parsing).
The model is the 2B-shaped random checkpoint (or --model), so steps take as long as the real
model's.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

QUESTIONS = (
    "What is the capital of the country with the longest river?",
    "Describe a quiet morning in a harbour town.",
    "How do bridges carry their own weight?",
    "Why is the evening sky sometimes red?",
    "Tell me about the old library near the market.",
    "Which trees grow best in cold northern forests?",
    "Explain how a train station schedules its platforms.",
    "What makes bread rise in a warm kitchen?",
)


def _in_process(adapter, resolver, question: str, answer_tokens: int) -> dict:
    """On a thread of its own, as the server's generation thread runs it (on the main thread
    a small model's steps can take several times longer, from how Numba's thread pool
    is woken; that would not be the HTTP layer's cost)."""
    out = {}
    t = threading.Thread(
        target=lambda: out.update(_in_thread(adapter, resolver, question, answer_tokens))
    )
    t.start()
    t.join()
    if not out:
        raise SystemExit("serve bench: the in-process answer failed (see above)")
    return out


def _in_thread(adapter, resolver, question: str, answer_tokens: int) -> dict:
    from ..generate import Finished, Tokens
    from ..server.schema import ChatMessage, ChatRequest

    req = ChatRequest(
        messages=[ChatMessage("user", question)],
        max_tokens=answer_tokens,
        sampling={"temperature": 0.0},
        ignore_eos=True,
    )
    t0 = time.perf_counter()
    first = last = None
    n = 0
    for ev in adapter.start(req, resolver, threading.Event()):
        if isinstance(ev, Tokens) and ev.text:
            now = time.perf_counter()
            first = first or now
            last = now
        if isinstance(ev, Finished):
            n = ev.totals["generated_tokens"]
    return _figures(t0, first, last, n)


def _http(client, url: str, question: str, answer_tokens: int) -> dict:
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": answer_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = None
    n = 0
    engine = {}
    with client.stream("POST", url + "/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"serve bench: the server answered {r.status_code}: {r.read()!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
                engine = obj.get("merlin") or {}
            for ch in obj.get("choices", []):
                if ch["delta"].get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
    out = _figures(t0, first, last, n)
    # the server's own figures for this very request (engine side of the generation thread)
    out["engine_ttft_ms"] = engine.get("engine_ttft_ms") or 0.0
    out["engine_tokens_per_s"] = engine.get("engine_tokens_per_s") or 0.0
    return out


def _figures(t0, first, last, n) -> dict:
    if first is None:
        raise SystemExit("serve bench: no token text came back")
    decode_s = last - first
    return {
        "ttft_ms": (first - t0) * 1e3,
        "tokens": n,
        "tokens_per_s": (n - 1) / decode_s if decode_s > 0 and n > 1 else 0.0,
    }


def run(
    model_dir: Path | None = None,
    weights: str = "q4",
    kv: str = "q8",
    answer_tokens: int = 32,
    rounds: int = 10,
    progress=print,
) -> dict:
    import httpx

    from ..demo import QWEN3VL_2B, ensure_random_checkpoint
    from ..model import load_model
    from ..server.cli import warm_up
    from ..server.engine_adapter import EngineAdapter
    from ..server.images import ImageResolver

    if model_dir is None:
        model_dir = ensure_random_checkpoint(
            QWEN3VL_2B, on_build=lambda: progress("building the 2B-shaped random checkpoint...")
        )
    from ..server.process import ServerProcess

    progress(f"starting merlin-cli serve on {model_dir} ({weights} weights, {kv} KV)...")
    server = ServerProcess(
        "--model", str(model_dir), "--weights", weights, "--kv", kv, "--spec", "off",
        "--sessions", "1",
    )  # fmt: skip
    try:
        progress("loading the same model in-process...")
        model = load_model(model_dir, weights=weights, kv=kv)
        warm_up(model)
        adapter = EngineAdapter(model, sessions=1, spec="off")
        resolver = ImageResolver(None, 1)
        client = httpx.Client(timeout=600)
        runs = {"in_process": [], "http": []}
        # one untimed round each: first-use costs (template, connections) out of the way
        _in_process(adapter, resolver, "Hello?", 4)
        _http(client, server.url, "Hello?", 4)
        for i in range(rounds):
            q = f"{QUESTIONS[i % len(QUESTIONS)]} (round {i})"
            order = ("in_process", "http") if i % 2 == 0 else ("http", "in_process")
            for side in order:
                if side == "http":
                    r = _http(client, server.url, q, answer_tokens)
                else:
                    r = _in_process(adapter, resolver, q, answer_tokens)
                runs[side].append(r)
            progress(
                f"round {i + 1}/{rounds}: "
                + ", ".join(
                    f"{s} TTFT {runs[s][-1]['ttft_ms']:.1f} ms, "
                    f"{runs[s][-1]['tokens_per_s']:.2f} tok/s"
                    for s in order
                )
            )
        client.close()
        resolver.close()
    finally:
        server.stop()

    def med(side, key):
        return float(np.median([r[key] for r in runs[side]]))

    out = {
        "model": str(model_dir),
        "weights": weights,
        "kv": kv,
        "answer_tokens": answer_tokens,
        "rounds": rounds,
        "threads": __import__("numba").get_num_threads(),
        "runs": runs,
    }
    for side in runs:
        out[side] = {"ttft_ms": med(side, "ttft_ms"), "tokens_per_s": med(side, "tokens_per_s")}
    out["ttft_overhead_ms"] = out["http"]["ttft_ms"] - out["in_process"]["ttft_ms"]
    out["decode_loss"] = 1 - out["http"]["tokens_per_s"] / out["in_process"]["tokens_per_s"]
    http = [r for r in runs["http"] if r["engine_tokens_per_s"] > 0]
    out["paired"] = {
        "ttft_overhead_ms": float(np.median([r["ttft_ms"] - r["engine_ttft_ms"] for r in http])),
        "decode_loss": float(
            np.median([1 - r["tokens_per_s"] / r["engine_tokens_per_s"] for r in http])
        ),
    }
    return out


def report(r: dict) -> str:
    ip, h, p = r["in_process"], r["http"], r["paired"]
    return "\n".join(
        [
            f"serve: {r['weights']} weights / {r['kv']} KV, {r['answer_tokens']} answer tokens, "
            f"{r['rounds']} rounds (medians), {r['threads']} threads",
            f"  in-process: TTFT {ip['ttft_ms']:8.1f} ms, decode {ip['tokens_per_s']:7.2f} tok/s",
            f"  HTTP (SSE): TTFT {h['ttft_ms']:8.1f} ms, decode {h['tokens_per_s']:7.2f} tok/s",
            f"  server overhead: TTFT +{r['ttft_overhead_ms']:.1f} ms (target <= 20 ms), "
            f"decode {100 * r['decode_loss']:+.1f}% slower (target <= 3%)",
            f"  paired, per HTTP request against the server's own engine timing of it: TTFT "
            f"+{p['ttft_overhead_ms']:.1f} ms, decode {100 * p['decode_loss']:+.1f}% slower",
        ]
    )
