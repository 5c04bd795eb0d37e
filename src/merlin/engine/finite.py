"""Checks for NaN and infinite values: weights once at load, logits at every step.

A checkpoint with one NaN (a bad conversion, a flipped bit, a hostile file) would otherwise
answer garbage ("!!!" from all-NaN logits) or crash a kernel that turns a value into an index.
Every float tensor is checked once when it is loaded, in its stored dtype, in chunks of
CHUNK elements (vectorised; BF16/F16 by their exponent bits, no conversion), and refused
with the tensor's name. At generation time, a step whose logits are not all finite stops the
answer with NonFiniteError instead of sampling from them.
"""

from __future__ import annotations

import numpy as np

from .errors import CheckpointError, MerlinError

CHUNK = 1 << 22  # elements per vectorised check (16 MB of f32)

# exponent bits all ones = inf or NaN
_EXP_MASK = {"BF16": np.uint16(0x7F80), "F16": np.uint16(0x7C00)}


class NonFiniteError(MerlinError):
    """The model computed NaN or infinite values (damaged weights or an overflow)."""


def _bits(raw: np.ndarray, dtype: str) -> np.ndarray:
    """BF16/F16 tensors as their uint16 bit patterns (a float16 array is viewed as such)."""
    if dtype in _EXP_MASK and raw.dtype.kind == "f":
        return raw.view(np.uint16)
    return raw


def first_nonfinite(raw: np.ndarray, dtype: str) -> int:
    """Flat index of the first NaN/inf of a stored tensor (raw: as stored; BF16/F16 as
    uint16 bits, or already as float16), or -1. Integer dtypes have none."""
    flat = _bits(raw, dtype).reshape(-1)
    mask = _EXP_MASK.get(dtype)
    if mask is None and not np.issubdtype(flat.dtype, np.floating):
        return -1
    for start in range(0, flat.size, CHUNK):
        chunk = flat[start : start + CHUNK]
        if mask is not None:
            bad = (chunk & mask) == mask
        else:
            bad = ~np.isfinite(chunk)
        if bad.any():
            return start + int(np.argmax(bad))
    return -1


def check_tensor(raw: np.ndarray, dtype: str, name: str, file) -> None:
    """CheckpointError naming the tensor when it holds a NaN or an infinity, or (F64) a value
    float32 cannot hold, which would become one when the weights are converted."""
    if dtype == "F64":  # finite values that round to infinity in float32
        flat = raw.reshape(-1)
        with np.errstate(over="ignore"):
            big = np.flatnonzero(np.isinf(flat.astype(np.float32)) & np.isfinite(flat))
        if big.size:
            raise CheckpointError(
                f"{file}: tensor {name!r} holds {raw.reshape(-1)[big[0]]:g} (at element "
                f"{int(big[0]):,} of {raw.size:,}), beyond what float32 holds. The weights "
                "are damaged; download the checkpoint again."
            )
    i = first_nonfinite(raw, dtype)
    if i >= 0:
        value = _bits(raw, dtype).reshape(-1)[i]
        what = "NaN" if dtype in _EXP_MASK and value & ~_EXP_MASK[dtype] & 0x7FFF else ""
        if dtype not in _EXP_MASK:
            what = "NaN" if np.isnan(value) else "an infinite value"
        what = what or "an infinite value"
        raise CheckpointError(
            f"{file}: tensor {name!r} holds {what} (at element {i:,} of {raw.size:,}). The "
            "weights are damaged; download the checkpoint again."
        )


def check_array(a: np.ndarray, what: str) -> None:
    """CheckpointError when a float array (e.g. converted or cached weights) is not finite."""
    i = first_nonfinite(np.asarray(a), "F32")
    if i >= 0:
        raise CheckpointError(
            f"{what} holds NaN or infinite values (at element {i:,}). The weights are damaged; "
            "download the checkpoint again."
        )


def logits_ok(logits: np.ndarray) -> bool:
    """True when every logit is finite (one vectorised pass over the vocabulary)."""
    return bool(np.isfinite(logits).all())


def check_logits(logits: np.ndarray, cache, keep: int, where: str) -> None:
    """NonFiniteError when a forward produced NaN/inf logits; the cache is first truncated to
    `keep` rows (the rows this forward wrote are unusable), so the session stays consistent
    and the next question works if the cause was this input."""
    if logits_ok(logits):
        return
    cache.truncate(min(keep, cache.length))
    raise NonFiniteError(
        f"the model computed NaN or infinite values for {where}, so the answer was stopped "
        "(nothing was sampled from them). The weights or an image may be damaged; reload the "
        "checkpoint or try without the image."
    )
