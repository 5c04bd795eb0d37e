"""Image file -> decoded Pillow image: the file-level half of preprocessing.

`open_image` opens a path without blocking on special files, lets Pillow use only the
decoders in IMAGE_FORMATS (never EPS, PDF or any plugin that starts a program), bounds the
memory of decoding (refused from the header above MAX_DECODE_BYTES; a JPEG far larger than
the pixel budget decoded at 1/2..1/8 scale, other formats shrunk by an integer factor right
after decoding), takes the first frame of an animation and applies EXIF orientation.
`to_rgb` turns any mode into RGB as transformers does, with 16-bit and float grey scaled to
8 bits instead of clipped. Every failure is an InputError that names the file and says what
to do. The pixel half (resize, normalise, patchify) is engine.vision.preprocess.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import InputError

# Upper bound for min/max pixels (the Qwen3-VL hub value: 16 megapixels, 400 MB of patches): a
# damaged config or setting must not make every image be resized to gigapixels.
PIXEL_LIMIT = 16_777_216
# The decoders Merlin lets Pillow use: formats that only decode pixels. Never EPS (runs
# Ghostscript), PDF, or any plugin that starts a program or reads other files.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
# Memory bounds of decoding: an image whose decoded pixels would take more than this is refused
# from its header, before decoding; one with more pixels than REDUCE_ABOVE and than the pixel
# budget is decoded at a lower resolution (JPEG: draft) or shrunk right after decoding.
MAX_DECODE_BYTES = 512 << 20
REDUCE_ABOVE = 24_000_000


def _name(source) -> str:
    return str(source) if source is not None else "the image"


def _decoded_bytes(mode: str, size: tuple[int, int]) -> int:
    """Bytes Pillow holds for a decoded image of this mode and size (multi-band 8-bit modes
    are stored as 4 bytes per pixel)."""
    if mode in ("1", "L", "P"):
        per = 1
    elif mode.startswith("I;16"):
        per = 2
    else:
        per = 4
    return size[0] * size[1] * per


def _check_decoded_size(im: Image.Image, name: str) -> None:
    need = _decoded_bytes(im.mode, im.size)
    if need > MAX_DECODE_BYTES:
        w, h = im.size
        raise InputError(
            f"{name}: the image is {w}x{h} pixels ({im.mode}); decoding it would take "
            f"{need / 1e9:.1f} GB of memory (at most {MAX_DECODE_BYTES / 1e9:.1f} GB). Scale it "
            "down or crop it, then attach it again."
        )


def _reduction(size: tuple[int, int], target_pixels: int | None) -> int:
    """The integer factor a very large image is shrunk by before the exact resize, or 1.

    Only images above REDUCE_ABOVE pixels (far beyond a photo's, so ordinary images keep the
    reference's exact resize), and only as far as the shrunk image still has at least the
    pixel budget: the exact resize that follows is then still a downscale."""
    pixels = size[0] * size[1]
    target = max(int(target_pixels or PIXEL_LIMIT), 1)
    if pixels <= max(REDUCE_ABOVE, target):
        return 1
    return max(1, math.isqrt(pixels // target))


def _draft(im: Image.Image, target_pixels: int | None) -> None:
    """JPEG: decode at 1/2, 1/4 or 1/8 scale when the image is far larger than needed."""
    k = _reduction(im.size, target_pixels)
    if k > 1 and im.format in ("JPEG", "MPO"):
        w, h = im.size
        im.draft(im.mode, (max(1, w // k), max(1, h // k)))


def _reduce_after_decode(im: Image.Image, target_pixels: int | None) -> Image.Image:
    """A decoded image still far larger than needed, shrunk by an integer factor (box
    average) so colour conversion and resizing stay within memory; else the image itself."""
    k = _reduction(im.size, target_pixels)
    if k <= 1:
        return im
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        return _high_depth_to_l(im, k)
    if im.mode in ("P", "PA", "1"):  # palette / bilevel: averaged as RGBA, a band at a time
        return _in_bands(im, k, "RGBA", lambda band: band.convert("RGBA"))
    try:  # a band at a time too: Pillow reduces RGBA / LA through a premultiplied full copy
        return _in_bands(im, k, im.mode, lambda band: band)
    except (ValueError, NotImplementedError):
        return im


_ORIENTATIONS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _orient(image: Image.Image, original: Image.Image) -> Image.Image:
    try:
        method = _ORIENTATIONS.get(original.getexif().get(0x0112))
    except Exception:  # an unreadable EXIF block: as transformers, ignore it
        method = None
    return image.transpose(method) if method is not None else image


def open_image(path: Path | str, target_pixels: int | None = None) -> Image.Image:
    """Decode an image file fully (first frame), EXIF orientation applied.

    Every failure becomes an InputError naming the file: missing, unreadable, not an image,
    truncated or corrupt, or larger than Pillow's decompression-bomb limit.
    """
    from ..safe_open import open_regular

    path = Path(os.path.expanduser(path))
    name = str(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        raise InputError(f"{name}: no such file. Check the path of the image.") from None
    except (OSError, ValueError) as e:  # a folder not allowed in, a name too long, a NUL
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InputError(f"{name}: cannot be read ({why}). Check the path of the image.") from None
    if path.is_dir():
        raise InputError(f"{name} is a folder, not an image file. Choose an image file.")
    try:
        # a FIFO or device is refused (never opened blocking); only IMAGE_FORMATS decode
        f = open_regular(path, "the image", InputError)
    except PermissionError:
        raise InputError(f"{name}: permission denied. Check that the file is readable.") from None
    try:
        with f, warnings.catch_warnings():
            # Between Pillow's warning and error limits an image is big but legitimate (a
            # 100-megapixel photo): decode it; smart_resize brings it down to max_pixels.
            # Plugin warnings about odd tags are noise for the user: errors still raise.
            warnings.simplefilter("ignore")
            with Image.open(f, formats=IMAGE_FORMATS) as im:
                im.seek(0)  # first frame of an animation
                _check_decoded_size(im, name)
                _draft(im, target_pixels)
                im.load()
                small = _reduce_after_decode(im, target_pixels)
                if small is im:
                    oriented = ImageOps.exif_transpose(im)
                    image = oriented if oriented is not im else im.copy()
                else:  # the reduced copy has no EXIF: orient it as the original says
                    image = _orient(small, im)
    except Image.DecompressionBombError:
        raise InputError(
            f"{name}: the image is too large to open safely (more than "
            f"{2 * (Image.MAX_IMAGE_PIXELS or 0) // 1_000_000} megapixels, Pillow's "
            "decompression-bomb limit). Scale it down or crop it, then attach it again."
        ) from None
    except UnidentifiedImageError:
        raise InputError(
            f"{name}: not an image file Merlin can read (or the file is damaged). Attach a PNG, "
            "JPEG, WebP, GIF, BMP or TIFF image."
        ) from None
    except PermissionError:
        raise InputError(f"{name}: permission denied. Check that the file is readable.") from None
    except MemoryError:
        raise InputError(
            f"{name}: not enough memory to decode the image. Scale it down and attach it again."
        ) from None
    except Exception as e:
        # Pillow reports truncated or corrupt data as OSError ("image file is truncated",
        # "broken data stream"), SyntaxError (bad header), ValueError, EOFError, struct.error
        # and more, depending on the format plugin: every one of them is a damaged file.
        detail = str(e).strip() or type(e).__name__
        raise InputError(
            f"{name}: the image file is truncated or corrupt ({detail}). Open it in an image "
            "viewer to check it, or export it again."
        ) from None
    return image


def to_rgb(image: Image.Image, source=None) -> Image.Image:
    """Any Pillow mode -> RGB, as transformers' convert_to_rgb does for 8-bit images: a band
    named A or a transparency entry means composite on white, otherwise Image.convert("RGB").

    16-bit and 32-bit integer / float grey images (I;16*, I, F) are scaled to 0..255 first;
    Pillow's own conversion clips them (a 16-bit PNG would come out nearly white).
    """
    mode = image.mode
    try:
        if mode.startswith("I;16") or mode in ("I", "F"):
            image = _high_depth_to_l(image)
        has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
        if has_alpha:  # a band at a time: four full-size copies otherwise
            return _in_bands(image, 1, "RGB", _on_white)
        return image.convert("RGB")
    except Exception as e:
        raise InputError(
            f"{_name(source)}: cannot convert its colour mode {mode!r} to RGB ({e}). "
            "Export the image as an ordinary RGB PNG or JPEG."
        ) from None


_BAND_PIXELS = 1 << 20  # pixels converted at a time (bounded temporaries for big images)


def _on_white(image: Image.Image) -> Image.Image:
    """An image with alpha (or a transparency entry) composited on white, as RGB."""
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _band_rows(width: int, k: int = 1) -> int:
    """Rows of a band: about _BAND_PIXELS pixels, a multiple of k."""
    return max(k, _BAND_PIXELS // max(1, width) // k * k)


def _in_bands(image: Image.Image, k: int, mode: str, convert) -> Image.Image:
    """convert(band) for row bands of about _BAND_PIXELS, box-reduced by k, pasted together.

    Each band is cropped out of the image and has a multiple of k rows, so the bands'
    reductions tile the whole image's exactly; nothing the size of the full-resolution image
    is allocated besides the result."""
    width, height = image.size
    rows = _band_rows(width, k)
    out = Image.new(mode, ((width + k - 1) // k, (height + k - 1) // k))
    for y in range(0, height, rows):
        band = convert(image.crop((0, y, width, min(height, y + rows))))
        out.paste(band.reduce(k) if k > 1 else band, (0, y // k))
    return out


def _high_depth_to_l(image: Image.Image, reduce_by: int = 1) -> Image.Image:
    """16/32-bit grey (I;16*, I, F) -> 8-bit L, box-reduced by `reduce_by` (Image.reduce),
    a band at a time (np.asarray of the whole image would copy it)."""
    if image.mode == "F":  # float grey: 0..1 (or 0..255 when any value is above 1)
        top = 0.0  # not getextrema: a NaN as the first pixel makes both extremes NaN
        width, height = image.size
        rows = _band_rows(width)
        with np.errstate(invalid="ignore"):
            for y in range(0, height, rows):
                band = np.asarray(image.crop((0, y, width, min(height, y + rows))))
                top = max(top, float(np.nanmax(band, initial=0.0)))
        top = 1.0 if not top > 1.0 else 255.0

        def to_8_bits(a):
            a = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=top, neginf=0.0)
            return np.clip(np.rint(a * (255.0 / top)), 0, 255)

    else:  # getextrema reads I but not the byte-ordered 16-bit modes (I;16B: TIFF, ImageJ)
        low, high = image.getextrema() if image.mode == "I" else (0, 65535)
        eight_bit = image.mode == "I" and 0 <= low and high <= 255  # 8-bit data stored as I

        def to_8_bits(a):
            if eight_bit:
                return a
            return (np.clip(a.astype(np.int64), 0, 65535) * 255 + 32767) // 65535

    def convert(band):
        return Image.fromarray(to_8_bits(np.asarray(band)).astype(np.uint8), "L")

    return _in_bands(image, max(1, reduce_by), "L", convert)
