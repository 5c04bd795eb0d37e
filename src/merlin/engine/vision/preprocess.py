"""Image file -> pixel patches, exactly as transformers' PIL image processor makes them.

The reference is `Qwen2VLImageProcessorPil` (transformers 5.x; the 4.57 "slow" class is the
same): convert to RGB with transparency composited on white, `smart_resize` to multiples of
patch_size * merge_size within [min_pixels, max_pixels], PIL bicubic resize, rescale by 1/255,
normalize with the checkpoint's mean/std, duplicate the frame to temporal_patch_size frames and
flatten into patches in 2x2-merge-block order. transformers' default *fast* processor resizes
with torchvision instead, which differs from PIL bicubic by a few uint8 levels on some pixels;
Merlin matches the PIL processor (docs/vision.md says why).

What Merlin adds in front of the reference (it receives files, not decoded images) lives in
engine.vision.image_file: the decoders allowed, memory bounds of decoding, EXIF orientation,
the first frame of an animation, 16-bit and float images scaled to 8 bits instead of clipped,
and an InputError naming the file for every way it can be unusable.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import CheckpointError, InputError
from .image_file import IMAGE_FORMATS, PIXEL_LIMIT, open_image, to_rgb

PREPROCESSOR_FILE = "preprocessor_config.json"
MAX_ASPECT_RATIO = 200  # smart_resize refuses anything longer than this, as transformers does
MIN_SIDE = 2  # a 1-pixel-wide image carries no picture; refuse it with a message
CHECK_PIXELS = 1 << 20  # check_image_file decodes at about this size where it can (JPEG)
RESAMPLE = Image.Resampling.BICUBIC
MAX_PIXEL_VALUE = 1000.0  # |normalised pixel| a preprocessor config may produce


@dataclass(frozen=True)
class PreprocessConfig:
    """The fields of preprocessor_config.json that shape the pixels. Defaults: Qwen3-VL hub."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    source: str = field(default="defaults", compare=False)

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this: one merged token covers factor x factor pixels."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def with_max_pixels(self, max_pixels: int | None) -> PreprocessConfig:
        """This config with the user's pixel budget (detail vs speed); None keeps the file's."""
        if max_pixels is None:
            return self
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int):
            raise InputError(f"max-pixels must be a whole number, got {max_pixels!r}.")
        if max_pixels > PIXEL_LIMIT:
            raise InputError(f"max-pixels {max_pixels} is too large; use at most {PIXEL_LIMIT}.")
        if max_pixels < self.factor * self.factor:
            raise InputError(
                f"max-pixels {max_pixels} is too small: one image token covers "
                f"{self.factor}x{self.factor} = {self.factor**2} pixels. "
                f"Use at least {self.factor**2}."
            )
        return replace(self, max_pixels=max_pixels, min_pixels=min(self.min_pixels, max_pixels))

    def tokens_for(self, width: int, height: int) -> int:
        """Vision tokens an image of this size becomes (after smart_resize)."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return (h // self.factor) * (w // self.factor)


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False


def _num(raw: dict, key: str, default, kind, path: Path, positive: bool = True):
    value = raw.get(key, default)
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and (value > 0 or not positive)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and _finite(value) and (value > 0 or not positive)
    if not ok:
        raise CheckpointError(f"{path}: '{key}' must be a positive number, got {value!r}.")
    return kind(value)


def parse_preprocess_config(raw: dict, path: Path) -> PreprocessConfig:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object.")
    d = PreprocessConfig()
    size = raw.get("size") or {}
    if not isinstance(size, dict):
        raise CheckpointError(f"{path}: 'size' must be an object.")
    # transformers: size.shortest_edge / longest_edge are min/max pixels; the older spelling is
    # top-level min_pixels / max_pixels, which wins when present (as in the processor __init__).
    min_px = raw.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", d.min_pixels)))
    max_px = raw.get("max_pixels", size.get("longest_edge", size.get("max_pixels", d.max_pixels)))
    cfg = PreprocessConfig(
        patch_size=_num(raw, "patch_size", d.patch_size, int, path),
        temporal_patch_size=_num(raw, "temporal_patch_size", d.temporal_patch_size, int, path),
        merge_size=_num(raw, "merge_size", d.merge_size, int, path),
        min_pixels=_num({"min_pixels": min_px}, "min_pixels", 0, int, path),
        max_pixels=_num({"max_pixels": max_px}, "max_pixels", 0, int, path),
        image_mean=_triple(raw, "image_mean", d.image_mean, path),
        image_std=_triple(raw, "image_std", d.image_std, path),
        rescale_factor=_num(raw, "rescale_factor", d.rescale_factor, float, path),
        do_resize=bool(raw.get("do_resize", True)),
        do_rescale=bool(raw.get("do_rescale", True)),
        do_normalize=bool(raw.get("do_normalize", True)),
        source=str(path),
    )
    if any(s <= 0 for s in cfg.image_std):
        raise CheckpointError(f"{path}: 'image_std' values must be positive.")
    if cfg.max_pixels > PIXEL_LIMIT or cfg.min_pixels > PIXEL_LIMIT:
        raise CheckpointError(
            f"{path}: min/max pixels ({cfg.min_pixels}/{cfg.max_pixels}) must be at most "
            f"{PIXEL_LIMIT}."
        )
    _check_pixel_range(cfg, path)
    if cfg.factor**2 > cfg.max_pixels:
        raise CheckpointError(
            f"{path}: one image token covers patch_size x merge_size = {cfg.factor} pixels "
            f"squared, more than max pixels ({cfg.max_pixels})."
        )
    if cfg.max_pixels < cfg.min_pixels:
        raise CheckpointError(
            f"{path}: max pixels ({cfg.max_pixels}) is below min pixels ({cfg.min_pixels})."
        )
    return cfg


def _check_pixel_range(cfg: PreprocessConfig, path: Path) -> None:
    """The normalised pixel values these constants give must be finite and moderate: a tiny
    image_std or a huge rescale_factor makes them infinite (NaN in the encoder)."""
    if cfg.patch_size > 1024 or cfg.temporal_patch_size > 64 or cfg.merge_size > 64:
        raise CheckpointError(
            f"{path}: patch_size {cfg.patch_size}, temporal_patch_size "
            f"{cfg.temporal_patch_size} or merge_size {cfg.merge_size} is not a Qwen3-VL value."
        )
    with np.errstate(all="ignore"):
        lut = _lut(cfg)
    top = float(np.max(np.abs(lut))) if np.all(np.isfinite(lut)) else math.inf
    if not top <= MAX_PIXEL_VALUE:
        raise CheckpointError(
            f"{path}: image_mean, image_std and rescale_factor give normalised pixel values up to "
            f"{top:g}; they must stay within +-{MAX_PIXEL_VALUE:g} (Qwen3-VL's are within +-1). "
            "The file is damaged; replace it with the original from the model download."
        )


def _triple(raw: dict, key: str, default, path: Path) -> tuple[float, float, float]:
    value = raw.get(key, list(default))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v) for v in value
        )
    ):
        raise CheckpointError(f"{path}: '{key}' must be three numbers, got {value!r}.")
    return tuple(float(v) for v in value)


def load_preprocess_config(folder: Path | str) -> PreprocessConfig:
    """preprocessor_config.json of a checkpoint folder; the Qwen3-VL hub values if absent."""
    from ..safe_open import read_bytes

    path = Path(folder) / PREPROCESSOR_FILE
    if not os.path.lexists(path):
        return PreprocessConfig(source=f"{path} (missing: Qwen3-VL defaults)")
    try:
        # a FIFO or device is refused with what it is, never opened blocking
        raw = json.loads(read_bytes(path, PREPROCESSOR_FILE, CheckpointError, 1 << 20))
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, or a 5000-digit number
        raise CheckpointError(f"{path}: not valid JSON ({e}).") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not valid JSON (nested too deeply).") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror}).") from None
    return parse_preprocess_config(raw, path)


# ---- geometry --------------------------------------------------------------------------------


def smart_resize(
    height: int, width: int, factor: int = 32, min_pixels: int = 65536, max_pixels: int = 16777216
) -> tuple[int, int]:
    """(height, width) rounded to multiples of factor with the pixel count in [min, max].

    transformers' `smart_resize`, operation for operation: Python's round() (half to even:
    80/32 = 2.5 -> 2), then scale down (floor) above max_pixels or up (ceil) below min_pixels.
    Raises ValueError above an aspect ratio of 200; callers turn it into an InputError.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# ---- decoding --------------------------------------------------------------------------------


# ---- pixels ----------------------------------------------------------------------------------


@dataclass
class PreparedImage:
    """One image ready for the vision encoder.

    pixel_values: [t*h*w, 3*T*P*P] float32 in the reference patch order; grid_thw: (t, h, w)
    in patches; n_tokens: vision tokens (image pads) it becomes = t*h*w / merge_size**2.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    merge_size: int
    source: str
    original_size: tuple[int, int]  # (width, height) after EXIF orientation
    resized_size: tuple[int, int]  # (width, height) fed to the encoder
    preprocess_ms: float = 0.0

    @property
    def n_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size * self.merge_size)


def _lut(cfg: PreprocessConfig) -> np.ndarray:
    """[3, 256] float32: uint8 value -> normalised value, rounded exactly as transformers:
    rescale in float64 then cast to float32, normalise in float32."""
    v = np.arange(256, dtype=np.float64)
    if cfg.do_rescale:
        v = v * cfg.rescale_factor
    v = v.astype(np.float32)
    out = np.empty((3, 256), np.float32)
    for c in range(3):
        if cfg.do_normalize:
            out[c] = (v - np.float32(cfg.image_mean[c])) / np.float32(cfg.image_std[c])
        else:
            out[c] = v
    return out


PATCHIFY_BYTES = 4 << 20  # image bytes patchified a pass (bounds np.take's index copies)


def patchify(u8: np.ndarray, lut: np.ndarray, cfg: PreprocessConfig):
    """[H, W, 3] uint8 -> ([gh*gw, 3*T*P*P] float32, (1, gh, gw)) in the reference order:
    merge blocks (bh, bw) row-major, inside a block (mh, mw), each patch flattened (C, T, y, x)
    with the still frame repeated T times. Each value is lut[channel, byte], looked up
    straight into the patches (no float image in between: a 16-megapixel picture would hold
    another 200 MB)."""
    height, width, c = u8.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    out = np.empty((gh * gw, c * t * p * p), np.float32)
    dst = out.reshape(gh // m, gw // m, m, m, c, t, p, p)
    src = u8.reshape(gh // m, m, p, gw // m, m, p, c).transpose(0, 3, 1, 4, 6, 2, 5)
    step = max(1, PATCHIFY_BYTES // (m * p * width * c))  # merge-block rows a pass
    for r in range(0, gh // m, step):  # np.take makes int64 indices of its view: in passes
        rows = slice(r, r + step)
        for ch in range(c):
            np.take(lut[ch], src[rows, :, :, :, ch], out=dst[rows, :, :, :, ch, 0], mode="clip")
            for frame in range(1, t):
                dst[rows, :, :, :, ch, frame] = dst[rows, :, :, :, ch, 0]
    return out, (1, gh, gw)


def check_shape(width: int, height: int, name: str) -> None:
    """InputError for an image Qwen3-VL cannot take: a side under MIN_SIDE pixels or an
    aspect ratio over MAX_ASPECT_RATIO."""
    if min(width, height) < MIN_SIDE:
        raise InputError(
            f"{name}: the image is only {width}x{height} pixels; there is nothing to see. "
            "Attach a larger image."
        )
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise InputError(
            f"{name}: the image is {width}x{height} pixels, an aspect ratio of "
            f"{max(width, height) / min(width, height):.0f}:1; Qwen3-VL accepts at most "
            f"{MAX_ASPECT_RATIO}:1. Crop it or cut it into parts and attach those."
        )


def check_image_file(path: Path | str) -> None:
    """InputError (naming the file) for an image file the engine would refuse when asked
    about it: damaged or truncated anywhere in its data (decoded, at a reduced scale where
    the format allows, CHECK_PIXELS), or of a shape check_shape refuses. An app checks what
    it attaches with this, so a chat never holds a picture no later question could use."""
    with open_image(path, target_pixels=CHECK_PIXELS) as small:  # every failure: InputError
        to_rgb(small, path).close()  # its colour mode converts as the question's will
    with Image.open(path, formats=IMAGE_FORMATS) as header:  # the whole image's shape
        width, height = header.size  # (EXIF orientation swaps sides: the same checks)
    check_shape(width, height, str(path))


def prepare_pil(image: Image.Image, cfg: PreprocessConfig, source=None) -> PreparedImage:
    """A decoded Pillow image (EXIF already applied) -> PreparedImage."""
    import time

    t0 = time.perf_counter()
    name = str(source) if source is not None else "the image"
    width, height = image.size
    check_shape(width, height, name)
    rgb = to_rgb(image, source)
    if cfg.do_resize:
        new_h, new_w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    else:
        new_h, new_w = height, width
        if height % cfg.factor or width % cfg.factor:
            raise InputError(
                f"{name}: {width}x{height} is not a multiple of {cfg.factor} and the "
                "preprocessor config turns resizing off. Resize the image first."
            )
    if (new_w, new_h) != (width, height):
        rgb = rgb.resize((new_w, new_h), resample=RESAMPLE)
    u8 = np.asarray(rgb, dtype=np.uint8)  # [H, W, 3]
    pixels, grid = patchify(u8, _lut(cfg), cfg)
    return PreparedImage(
        pixel_values=pixels,
        grid_thw=grid,
        merge_size=cfg.merge_size,
        source=name,
        original_size=(width, height),
        resized_size=(new_w, new_h),
        preprocess_ms=(time.perf_counter() - t0) * 1e3,
    )


def prepare_image(
    path: Path | str | os.PathLike, cfg: PreprocessConfig, max_pixels: int | None = None
) -> PreparedImage:
    """Image file -> PreparedImage. max_pixels: the user's detail/speed budget (None: config)."""
    import time

    t0 = time.perf_counter()
    cfg = cfg.with_max_pixels(max_pixels)
    image = open_image(path, cfg.max_pixels)
    try:
        prepared = prepare_pil(image, cfg, source=Path(os.path.expanduser(path)))
    finally:
        image.close()
    prepared.preprocess_ms = (time.perf_counter() - t0) * 1e3
    return prepared
