"""How long the vision encoder takes for a picture on this machine: a small cost model fitted
from the encoder's own measurements, cached on disk.

An encode of n patches (in frames of s patches each) costs

    seconds = gemm_flops(n) / gemm_rate + attn_flops(s) / attn_rate + other * n

gemm_flops is linear in n (the weight products), attn_flops quadratic in each frame's
patches (scores and values: 4 s^2 x hidden per block), both exact from
VisionEncoder.flops(); the rates and the per-patch rest are what this machine measured. Each
encode's VisionOutput (gemm_ms, attn_ms, ms) adds to running sums, older sums decayed by DECAY,
so the rates follow the machine (other work on a shared host, a new thread count) and a
long encode weighs more than the warm-up's tiny one. Before the first measurement PRIOR
gives a rough figure (its rates: about what 2 AVX-512 cores do; docs/vision.md).

The sums are kept per (CPU name, kernel threads, encoder shape, weights format) in one JSON
file: MERLIN_VISION_SPEED or <user cache>/merlin/vision_speed.json. A damaged or unwritable
file only loses the cache (the model starts from PRIOR again); never an error for the user.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DECAY = 0.7  # weight of what was measured before, at each new encode
PRIOR = {"gemm_rate": 60e9, "attn_rate": 40e9, "other_s_per_patch": 2e-6}
_LOCK = threading.Lock()


def speed_file() -> Path:
    env = os.environ.get("MERLIN_VISION_SPEED")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("merlin")) / "vision_speed.json"


@dataclass
class Speed:
    """Running sums of measured work and time (see the module docstring)."""

    gemm_flops: float = 0.0
    gemm_s: float = 0.0
    attn_flops: float = 0.0
    attn_s: float = 0.0
    patches: float = 0.0
    other_s: float = 0.0

    @property
    def measured(self) -> bool:
        return self.gemm_s > 0 and self.patches > 0

    def rates(self) -> tuple[float, float, float]:
        """(gemm FLOP/s, attention FLOP/s, other seconds per patch)."""
        gemm = self.gemm_flops / self.gemm_s if self.gemm_s > 0 else PRIOR["gemm_rate"]
        attn = self.attn_flops / self.attn_s if self.attn_s > 0 else PRIOR["attn_rate"]
        other = self.other_s / self.patches if self.patches > 0 else PRIOR["other_s_per_patch"]
        return gemm, attn, other

    def add(self, flops: dict, gemm_s: float, attn_s: float, total_s: float, patches: int):
        for name in ("gemm_flops", "gemm_s", "attn_flops", "attn_s", "patches", "other_s"):
            setattr(self, name, getattr(self, name) * DECAY)
        self.gemm_flops += flops["gemm"]
        self.gemm_s += gemm_s
        self.attn_flops += flops["attn"]
        self.attn_s += attn_s
        self.patches += patches
        self.other_s += max(0.0, total_s - gemm_s - attn_s)


def speed_key(encoder) -> str:
    from ..warmup import cpu_name

    try:
        import numba

        threads = numba.get_num_threads()
    except Exception:  # pragma: no cover
        threads = 0
    c = encoder.cfg
    shape = f"{c.depth}x{c.hidden_size}x{c.intermediate_size}"
    return f"{cpu_name()}|t{threads}|{shape}|{encoder.weights_format}"


def _read_all() -> dict:
    try:
        data = json.loads(speed_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def load_speed(encoder) -> Speed:
    raw = _read_all().get(speed_key(encoder))
    if not isinstance(raw, dict):
        return Speed()
    try:
        s = Speed(**{k: float(v) for k, v in raw.items() if k in Speed.__dataclass_fields__})
    except (TypeError, ValueError):
        return Speed()
    values = vars(s).values()
    return s if all(v >= 0 and v == v and v != float("inf") for v in values) else Speed()


def record(encoder, output, patches: int) -> Speed:
    """Add one encode (a VisionOutput) to this machine's sums and save them."""
    with _LOCK:
        speed = load_speed(encoder)
        speed.add(
            output.flops, output.gemm_ms / 1e3, output.attn_ms / 1e3, output.ms / 1e3, patches
        )
        data = _read_all()
        data[speed_key(encoder)] = vars(speed)
        path = speed_file()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, path)
        except OSError as e:
            log.info("vision speed not saved to %s: %s", path, e)
        return speed


def estimate_seconds(encoder, grids, speed: Speed | None = None) -> float:
    """Predicted encode time of these grids [(t, h, w)] on this machine."""
    speed = speed if speed is not None else load_speed(encoder)
    flops = encoder.flops(grids)
    gemm, attn, other = speed.rates()
    patches = sum(t * h * w for t, h, w in grids)
    return flops["gemm"] / gemm + flops["attn"] / attn + other * patches


def grid_for(width: int, height: int, pre, tokens: int | None) -> tuple[int, int, int]:
    """The (t, h, w) patch grid of a width x height image at this budget."""
    from .budget import preprocess_for
    from .preprocess import smart_resize

    cfg = preprocess_for(pre, tokens)
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return (1, h // cfg.patch_size, w // cfg.patch_size)
