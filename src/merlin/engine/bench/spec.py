"""Speculative decoding figures: V(K)/T and tokens/s with speculation off, on and auto.

Random weights do not copy their prompt, so "an answer that repeats its input" is made the
way it happens in a chat: the drafter's history already holds an earlier answer to the same
question (a regenerate, or a follow-up that quotes the answer). The free-form case drafts
from the prompt and the answer so far (greedy random weights fall into loops, so it repeats
too); "novel" samples nearly uniformly (temperature 100, no top-k/top-p): text that never
repeats, where auto must not lose to off. Greedy runs check the token ids of on and auto
against off.
"""

from __future__ import annotations

import time

from ..generate import AnswerOptions, Finished, generate
from ..model import load_model
from ..prompt import chat_prompt_ids, text_prompt
from ..sampling import SamplingParams
from ..speculative import Drafter
from .decode import fill_cache, verify_cost

GREEDY = SamplingParams(temperature=0.0)
MODES = ("off", "on", "auto")


def _run(model, prompt, mode, k, n, history, sampling=GREEDY):
    drafter = Drafter(exclude={model.config.image_token_id, model.config.video_token_id})
    drafter.extend(history + prompt)
    options = AnswerOptions(sampling, max_new_tokens=n, ignore_eos=True, spec=mode, spec_k=k)
    for event in generate(model, text_prompt(prompt), options, drafter=drafter):
        if isinstance(event, Finished):
            return event


def scenario(model, prompt, n, k, history_of, sampling=GREEDY) -> dict:
    plain = _run(model, prompt, "off", k, n, [], sampling)
    history = history_of(plain.token_ids)
    out = {}
    for mode in MODES:
        done = _run(model, prompt, mode, k, n, history, sampling)
        out[mode] = {
            "tokens_per_s": done.tokens_per_s,
            # sampled runs draw differently with drafts: equal in distribution, not in ids
            "identical_to_off": done.token_ids == plain.token_ids,
            **done.spec,
        }
    off = out["off"]["tokens_per_s"]
    for mode in ("on", "auto"):
        out[mode]["speedup"] = out[mode]["tokens_per_s"] / off
    return out


def run(folder, weights: str, n: int = 64, k: int = 4) -> dict:
    import numpy as np

    t0 = time.perf_counter()
    model = load_model(folder, weights=weights, kv="q8")
    result = {"weights": weights, "load_s": time.perf_counter() - t0}
    cache = model.new_cache(256)
    fill_cache(cache, 128, np.random.default_rng(0))
    result["verify"] = verify_cost(model, cache, 128)
    tok = model.tokenizer
    repeat = chat_prompt_ids(tok, "Copy this list exactly: apples, pears, plums, figs, dates.")
    free = chat_prompt_ids(tok, "Write a short story about a lighthouse keeper.")
    # (a) the earlier answer to the same question is in the history: drafts are right
    result["repeat"] = scenario(model, repeat, n, k, lambda ans: repeat + ans)
    # (b) drafts only from the prompt and the answer so far (greedy random weights loop, so
    # this still repeats itself)
    result["free"] = scenario(model, free, n, k, lambda ans: [])
    # (c) text that does not repeat: the 2B random weights give peaked distributions (at
    # temperature 1 the output still loops), so sample nearly uniformly over the vocabulary:
    # suffixes then almost never recur; auto must not be slower than off here
    novel = SamplingParams(temperature=100.0, top_k=0, top_p=1.0, seed=7)
    result["novel"] = scenario(model, free, n, k, lambda ans: [], novel)
    return result


def report(results: list[dict]) -> str:
    lines = []
    for r in results:
        v = r["verify"]
        lines.append(
            f"{r['weights']}: T = {v['T_ms']:.1f} ms, V(K)/T for K=1..8: "
            + " ".join(f"{v[f'V({k})/T']:.2f}" for k in range(1, 9))
        )
        for name in ("repeat", "free", "novel"):
            s = r[name]
            parts = []
            for mode in MODES:
                m = s[mode]
                part = f"{mode} {m['tokens_per_s']:.1f} tok/s"
                if mode != "off":
                    same = "yes" if m["identical_to_off"] else "NO"
                    if name == "novel":
                        same = "n/a (sampled)"
                    part += (
                        f" (x{m['speedup']:.2f}, hit {m['hit_rate']:.0%} of {m['drafted']}, "
                        f"{m['tokens_per_forward']:.2f} tok/fwd, identical: {same})"
                    )
                parts.append(part)
            lines.append(f"  {name:6s}: " + "; ".join(parts))
    return "\n".join(lines)
