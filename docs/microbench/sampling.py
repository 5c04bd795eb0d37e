"""Time one sampled token (Sampler.sample) on a Qwen3-VL-sized vocabulary (151,936 logits,
standard normal x 3) for the app's default settings, a repetition penalty over a 32k-token
history, and top-p without top-k; medians of 5 rounds of 5 (docs/benchmarks.md, "Sampling").

    python docs/microbench/sampling.py
"""

import timeit

import numpy as np

from merlin.engine.sampling import Sampler, SamplingParams

rng = np.random.default_rng(0)
logits = (rng.standard_normal(151_936) * 3).astype(np.float32)
history = [int(t) for t in rng.integers(0, 151_936, 32_000)]
CASES = {
    "default (T 0.7, top-k 20, top-p 0.8)": SamplingParams(),
    "default + repetition penalty 1.1, 32k history": SamplingParams(repetition_penalty=1.1),
    "T 1, top-p 0.95, no top-k": SamplingParams(temperature=1.0, top_k=0, top_p=0.95),
    "T 1, no top-k, no top-p": SamplingParams(temperature=1.0, top_k=0, top_p=1.0),
}
for name, params in CASES.items():
    sampler = Sampler(params)
    rounds = [timeit.timeit(lambda s=sampler: s.sample(logits, history), number=5) / 5]
    rounds += [
        timeit.timeit(lambda s=sampler: s.sample(logits, history), number=5) / 5 for _ in range(4)
    ]
    print(f"{name:<48} {np.median(rounds) * 1e3:6.2f} ms a token")
