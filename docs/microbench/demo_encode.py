"""The shipped demo model's vision encoder on a picture of each size, through the kernel pool
(the process's threads) and on the calling thread alone, alternating, 7 rounds each: median
ms (docs/benchmarks.md, "The demo model's picture on one kernel thread"). Forces each way by
SERIAL_ENCODE_MACS, so it measures both whatever the rule chooses.

    python docs/microbench/demo_encode.py
"""

import tempfile
import time
from pathlib import Path

import numba
import numpy as np
from PIL import Image

from merlin.engine.demo import ensure_demo_checkpoint
from merlin.engine.model import load_model
from merlin.engine.vision import encoder

model = load_model(ensure_demo_checkpoint(), weights="q4", kv="q8")
per_patch = model.vision.require()._weights_per_patch
print(f"{numba.get_num_threads()} kernel threads; {per_patch:,} matrix weights a patch")
with tempfile.TemporaryDirectory() as folder:
    for side in (224, 448, 672, 896):
        path = Path(folder) / f"{side}.png"
        pixels = np.random.default_rng(side).integers(0, 256, (side, side, 3), np.uint8)
        Image.fromarray(pixels).save(path)
        image = model.vision.prepare(path, max_pixels=side * side)
        times = {"pool": [], "one thread": []}
        for r in range(8):
            for way, macs in (("pool", 0), ("one thread", 1 << 62)):
                encoder.SERIAL_ENCODE_MACS = macs
                t0 = time.perf_counter()
                model.vision.encode([image])
                if r:  # the first round compiles / warms
                    times[way].append(time.perf_counter() - t0)
        patches = len(image.pixel_values)
        medians = ", ".join(f"{way} {np.median(t) * 1e3:.1f} ms" for way, t in times.items())
        macs = patches * per_patch / 1e9
        print(f"{side}x{side}: {patches} patches, {macs:.2f} G MACs: {medians}")
