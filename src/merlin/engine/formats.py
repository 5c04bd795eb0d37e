"""Names of the weight and KV cache formats, and what a user gets without choosing.

A module of its own (no NumPy, no Numba) so that argument parsing and the app's settings can
use these names without importing the kernels.

Defaults: `auto` weights, q4_0 or q8_0 decoder blocks, whichever the kernels run faster on
this CPU class (engine/autoweights.py; q4 reads 1.1 GB per token for Qwen3-VL-2B, q8 2.0, bf16
3.4), a q8_0 embedding/lm_head (engine.text.HEAD_FORMAT) and a q8 KV cache; quality against the
f32 path in the README (tests/test_quality.py).
"""

WEIGHT_FORMATS = ("f32", "q8", "q4")  # what weights are stored as
AUTO_WEIGHTS = "auto"  # resolved to q4 or q8 by engine/autoweights.resolve
WEIGHT_CHOICES = (AUTO_WEIGHTS, *WEIGHT_FORMATS)  # what a user may ask for
KV_FORMATS = ("f32", "q8")
DEFAULT_WEIGHTS = AUTO_WEIGHTS
DEFAULT_KV = "q8"
