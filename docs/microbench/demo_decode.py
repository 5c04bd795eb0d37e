"""Decode speed of the shipped demo model (q4 weights, q8 KV, greedy, speculation off): 200
tokens after a short warm-up turn, 3 rounds, tokens/s each (docs/benchmarks.md, "The demo
model on one kernel thread"). Run it as is and with NUMBA_NUM_THREADS=1 to compare.

    python docs/microbench/demo_decode.py
"""

import time

import numba

from merlin.engine.demo import ensure_demo_checkpoint
from merlin.engine.model import load_model
from merlin.engine.sampling import SamplingParams
from merlin.engine.session import Session

model = load_model(ensure_demo_checkpoint(), weights="q4", kv="q8")
greedy = dict(sampling=SamplingParams(temperature=0.0), spec="off", ignore_eos=True)
rates = []
for _ in range(3):
    s = Session(model)
    list(s.ask("Describe a lake.", max_new_tokens=8, **greedy))
    t0 = time.perf_counter()
    done = list(s.ask("Tell me a long story about shapes.", max_new_tokens=200, **greedy))[-1]
    rates.append(done.generated_tokens / (time.perf_counter() - t0))
print(f"{numba.get_num_threads()} kernel threads: " + ", ".join(f"{r:.0f}" for r in rates))
