"""llama.cpp's side of `python -m merlin.engine.bench peer`, run in the peer venv (peer.py), which
holds llama-cpp-python; self-contained (no Merlin import). One JSON object on stdout.

    python llama_driver.py quantize SRC.gguf DST.gguf q8_0|q4_0
    python llama_driver.py greedy MODEL.gguf N ID ID ...        greedy continuation of the ids
                                                               and the prompt's last logits
    python llama_driver.py time MODEL.gguf --contexts 128 2048 --prefill 512 --steps 8
                                           --threads 2 [--flash-attn]

time: per context C, a prompt of C random token ids is evaluated, then `steps` one-token
evaluations are timed (median ms/token, the first dropped as warm-up); prefill: n tokens into
an empty context in batches of n (median of 2). Token ids are drawn from the tokenizer's
normal tokens; with random weights the values do not change the cost.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time


def quantize(src: str, dst: str, kind: str, threads: int = 2) -> dict:
    import llama_cpp

    ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype[kind]
    params.nthread = threads
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc}) for {kind}")
    return {"seconds": time.perf_counter() - t0}


def _load(path: str, n_ctx: int, threads: int, flash_attn: bool = False, n_batch: int = 512):
    from llama_cpp import Llama

    return Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
    )


def _last_logits(llm):
    """The last evaluated token's logits, from llama.cpp itself (llama-cpp-python 0.3.36 leaves
    Llama.scores at zero unless every token's logits are kept)."""
    import llama_cpp
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def greedy(path: str, n: int, ids: list[int], threads: int = 2) -> dict:
    import numpy as np

    llm = _load(path, max(256, len(ids) + n + 8), threads)
    out = []
    llm.eval(list(ids))
    prompt_logits = _last_logits(llm).tolist()
    for _ in range(n):
        nxt = int(np.argmax(_last_logits(llm)))
        out.append(nxt)
        llm.eval([nxt])
    return {"tokens": out, "prompt_logits": prompt_logits}


def timing(path, contexts, prefill_n, steps, threads, flash_attn) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    n_ctx = -(-max(max(contexts) + steps + 8, prefill_n + 8, 256) // 256) * 256
    llm = _load(path, n_ctx, threads, flash_attn)
    n_normal = llm.n_vocab()
    hi = min(n_normal, 2000)
    out = {"decode": [], "flash_attn": flash_attn}
    for ctx in contexts:
        llm.reset()  # eval() drops the cache past n_tokens (0 now) before it runs
        prompt = rng.integers(10, hi, ctx).tolist()
        t0 = time.perf_counter()
        llm.eval(prompt)
        fill_s = time.perf_counter() - t0
        times = []
        for _ in range(steps + 1):
            tok = int(rng.integers(10, hi))
            t0 = time.perf_counter()
            llm.eval([tok])
            times.append(time.perf_counter() - t0)
        out["decode"].append(
            {
                "context": ctx,
                "ms_per_token": float(np.median(times[1:])) * 1e3,
                "prompt_tokens_per_s": ctx / fill_s,
            }
        )
    seconds = []
    for _ in range(2):
        llm.reset()
        prompt = rng.integers(10, hi, prefill_n).tolist()
        t0 = time.perf_counter()
        llm.eval(prompt)
        seconds.append(time.perf_counter() - t0)
    s = float(np.median(seconds))
    out["prefill"] = {"tokens": prefill_n, "seconds": s, "tokens_per_s": prefill_n / s}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize")
    q.add_argument("src")
    q.add_argument("dst")
    q.add_argument("kind", choices=("q8_0", "q4_0"))
    g = sub.add_parser("greedy")
    g.add_argument("model")
    g.add_argument("n", type=int)
    g.add_argument("ids", type=int, nargs="+")
    t = sub.add_parser("time")
    t.add_argument("model")
    t.add_argument("--contexts", type=int, nargs="+", default=[128, 2048])
    t.add_argument("--prefill", type=int, default=512)
    t.add_argument("--steps", type=int, default=8)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--flash-attn", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "quantize":
        result = quantize(a.src, a.dst, a.kind)
    elif a.cmd == "greedy":
        result = greedy(a.model, a.n, a.ids)
    else:
        result = timing(a.model, a.contexts, a.prefill, a.steps, a.threads, a.flash_attn)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
