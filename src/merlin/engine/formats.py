"""Names of the weight and KV cache formats, and what a user gets without choosing.

A module of its own (no NumPy, no Numba) so that argument parsing and the app's settings can
use these names without importing the kernels.

Defaults: q4_0 decoder blocks with a q8_0 embedding/lm_head (engine.text.HEAD_FORMAT) and a q8
KV cache: 1.1 GB read per token for Qwen3-VL-2B instead of 3.4 GB in bf16; quality against the
f32 path in the README (tests/test_quality.py).
"""

WEIGHT_FORMATS = ("f32", "q8", "q4")
KV_FORMATS = ("f32", "q8")
DEFAULT_WEIGHTS = "q4"
DEFAULT_KV = "q8"
