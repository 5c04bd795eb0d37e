"""Session figures for `python -m merlin.engine.bench session`: how fast a follow-up starts.

On the 2B-shaped random checkpoint: a conversation whose first turn holds an image, then
text turns up to a history of about `history_tokens` text tokens (plus the image's). Time to
first token (from the call to the first streamed token, greedy, one token) of a follow-up:

- without reuse: a fresh session (no cache, no image embeddings), i.e. vision encoder +
  prefill of the whole conversation, what a stateless engine does every turn;
- with reuse: the session that already holds the history (only the new turn is prefilled);
- restored: a new session opened from the saved file (file read, checksums, then only the new
  turn), with the file's pages dropped from the OS cache first (posix_fadvise DONTNEED after
  fsync), so it is read from the disk, as when a chat is reopened later.

The recompute baseline for the restore is the same "without reuse" figure. Every figure is a
median (the host may be shared); ratios are reuse_speedup and restore_speedup.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = (
    "the river light stone morning window garden quiet market bridge yellow small old green "
    "music paper table walk city north winter harbour tower library road friend evening rain "
    "bread kitchen mountain letter story blue field summer train station lamp forest cloud"
).split()


def _text(rng, n_words: int) -> str:
    words = rng.choice(WORDS, n_words)
    out = []
    for i, w in enumerate(words):
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out) + "."


def _image(path: Path, size: int) -> Path:
    from .vision import bench_image

    return bench_image(size, size, path)


def _ttft(start) -> tuple[float, dict]:
    """Seconds from calling start() (which sets up and returns the events) to the first
    streamed token."""
    from ..generate import Finished, PrefillDone, Tokens

    t0 = time.perf_counter()
    events = start()
    first = None
    info = {}
    for ev in events:
        if isinstance(ev, PrefillDone):
            info = {"computed": ev.n_tokens, "reused": ev.reused, "vision_ms": ev.vision_ms}
        if isinstance(ev, Tokens) and ev.ids and first is None:
            first = time.perf_counter() - t0
        if isinstance(ev, Finished):
            break
    return first, info


def _drop_page_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def run(
    model_dir: Path | None = None,
    weights: str = "q4",
    kv: str = "f32",
    history_tokens: int = 1500,
    image_size: int = 512,
    repeats: int = 3,
    progress=print,
) -> dict:
    from ..demo import QWEN3VL_2B, ensure_random_checkpoint
    from ..model import load_model
    from ..sampling import SamplingParams
    from ..session import Message, Session, SessionSettings

    if model_dir is None:
        model_dir = ensure_random_checkpoint(
            QWEN3VL_2B, on_build=lambda: progress("building the 2B-shaped random checkpoint...")
        )
    progress(f"loading {model_dir} ({weights} weights, {kv} KV)...")
    t0 = time.perf_counter()
    model = load_model(model_dir, weights=weights, kv=kv)
    load_s = time.perf_counter() - t0
    greedy = SamplingParams(temperature=0.0)
    gen = dict(sampling=greedy, max_new_tokens=1, ignore_eos=True, spec="off")
    settings = SessionSettings(context_budget=8192, max_pixels=image_size * image_size)
    tmp = Path(tempfile.mkdtemp(prefix="merlin-bench-session-"))
    try:
        image = _image(tmp / "picture.png", image_size)
        # warm-up: compile every kernel on a small conversation (not measured)
        progress("compiling kernels (warm-up)...")
        warm = Session(model, settings=settings)
        small = _image(tmp / "small.png", 64)
        _ttft(lambda: warm.ask("Hello " * 20, [small], **gen))
        _ttft(lambda: warm.ask("And then?", **gen))

        # the conversation: an image turn, then text turns up to the history size
        rng = np.random.default_rng(0)
        history = [
            Message.user("Describe this picture in detail.", [image]),
            Message.assistant(_text(rng, 120)),
        ]
        probe = Session(model, settings=settings)
        while True:
            probe.set_messages(history)
            rendered = probe._render(probe.messages, set(), generation_prompt=False)
            n_image = sum(im.n_tokens for im in rendered.images)
            if len(rendered.ids) - n_image >= history_tokens:
                break
            history += [
                Message.user(_text(rng, 14).rstrip(".") + "?"),
                Message.assistant(_text(rng, 90)),
            ]
        n_history = len(rendered.ids)
        question = "What colour is the sky in the picture, and is there anything in the water?"
        progress(
            f"history: {len(history)} messages, {n_history} tokens "
            f"({n_image} image + {n_history - n_image} text)"
        )

        def cold():
            s = Session(model, settings=settings)  # no cache, no embeddings, no prepared image
            s.set_messages(history)
            return s.ask(question, **gen)

        progress(f"without reuse ({repeats}x: vision + prefill of the whole conversation)...")
        cold_runs = [_ttft(cold) for _ in range(repeats)]

        progress("computing the history once (warm) and saving it...")
        session = Session(model, settings=settings)
        session.set_messages(history)
        t0 = time.perf_counter()
        session.warm()
        warm_s = time.perf_counter() - t0
        path = tmp / "chat.msession"
        t0 = time.perf_counter()
        size = session.save(path)
        save_s = time.perf_counter() - t0

        progress(f"with reuse ({2 * repeats}x)...")
        reuse_runs = []

        n_cached = session.cached_tokens

        def reuse():
            session.set_messages(history)  # forget the previous follow-up and its answer
            session.drop_cache(n_cached)  # the cache holds the history, as after a turn
            return session.ask(question, **gen)

        for _ in range(2 * repeats):
            reuse_runs.append(_ttft(reuse))

        progress(f"restored from disk ({2 * repeats}x)...")
        restore_runs, restore_ms, dropped = [], [], True

        def restore():
            s, result = Session.open(model, path, settings)
            if not result.restored:
                raise SystemExit(f"session bench: the saved session did not load: {result.reason}")
            restore_ms.append(result.ms)
            return s.ask(question, **gen)

        for _ in range(2 * repeats):
            dropped = _drop_page_cache(path) and dropped
            restore_runs.append(_ttft(restore))
    finally:
        for p in tmp.glob("*"):
            p.unlink(missing_ok=True)
        tmp.rmdir()

    def med(runs):
        return float(np.median([r[0] for r in runs]))

    cold_s, reuse_s, restore_s = med(cold_runs), med(reuse_runs), med(restore_runs)
    return {
        "model": str(model_dir),
        "weights": weights,
        "kv": kv,
        "threads": __import__("numba").get_num_threads(),
        "load_s": load_s,
        "history_messages": len(history),
        "history_tokens": n_history,
        "image_tokens": n_image,
        "follow_up_tokens": cold_runs[-1][1].get("computed", 0),
        "reused_tokens": reuse_runs[-1][1].get("reused", 0),
        "computed_with_reuse": reuse_runs[-1][1].get("computed", 0),
        "ttft_no_reuse_s": cold_s,
        "ttft_reuse_s": reuse_s,
        "ttft_restore_s": restore_s,
        "restore_read_ms": float(np.median(restore_ms)),
        "vision_ms_no_reuse": float(np.median([r[1].get("vision_ms", 0) for r in cold_runs])),
        "all_s": {
            "no_reuse": [r[0] for r in cold_runs],
            "reuse": [r[0] for r in reuse_runs],
            "restore": [r[0] for r in restore_runs],
        },
        "warm_s": warm_s,
        "save_s": save_s,
        "file_bytes": size,
        "page_cache_dropped": dropped,
        "reuse_speedup": cold_s / reuse_s,
        "restore_speedup": cold_s / restore_s,
    }


def report(r: dict) -> str:
    cache_note = "" if r["page_cache_dropped"] else " (file read from the OS page cache)"
    return "\n".join(
        [
            f"session: {r['weights']} weights / {r['kv']} KV, {r['threads']} threads; history "
            f"{r['history_tokens']} tokens ({r['image_tokens']} image) in "
            f"{r['history_messages']} messages; follow-up {r['computed_with_reuse']} new tokens",
            f"  time to first token, no reuse (vision + full prefill): "
            f"{r['ttft_no_reuse_s']:8.2f} s (vision {r['vision_ms_no_reuse'] / 1e3:.2f} s)",
            f"  time to first token, reuse ({r['reused_tokens']} tokens reused):"
            f"        {r['ttft_reuse_s']:8.3f} s   -> reuse speedup   {r['reuse_speedup']:6.1f}x",
            f"  time to first token, restored from disk{cache_note}:"
            f" {r['ttft_restore_s']:8.3f} s   -> restore speedup {r['restore_speedup']:6.1f}x",
            f"  session file {r['file_bytes'] / 1e6:.0f} MB: save {r['save_s']:.2f} s, "
            f"read+check {r['restore_read_ms'] / 1e3:.2f} s; computing the history "
            f"(warm) {r['warm_s']:.1f} s",
        ]
    )
