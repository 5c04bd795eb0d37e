"""Images from anywhere, beyond tests/test_vision.py (which covers a text file, a truncated and
a corrupt PNG, a PNG bomb, 1x1, 2x401 / 1000x3 strips, missing files and the colour modes saved
as TIFF): byte mutations of PNG, JPEG, WebP, GIF, BMP and TIFF files, bombs in every format,
the 100000x2 strip, 2x2, 16-bit RGB and grey+alpha, CMYK JPEG, palette images with a
transparent index, and animations (only the first frame is used, as docs/robustness.md says).

Every file gives a PreparedImage with finite pixels or an InputError naming the file.
"""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from fuzzutil import attempt, fuzz, mutate_bytes, watchdog
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from merlin.engine.errors import InputError
from merlin.engine.vision.preprocess import PreprocessConfig, prepare_image

PRE = PreprocessConfig(min_pixels=32 * 32, max_pixels=128 * 128)  # small: fast cases
FORMATS = {
    "png": {},
    "jpeg": {"quality": 90},
    "webp": {"quality": 80},
    "gif": {},
    "bmp": {},
    "tiff": {"compression": "tiff_lzw"},
}


def picture(w=48, h=40, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = np.zeros((h, w, 3), np.uint8)
    base[..., 0] = np.linspace(0, 255, w)[None, :]
    base[..., 1] = np.linspace(0, 255, h)[:, None]
    base[..., 2] = rng.integers(0, 256, (h, w))
    return Image.fromarray(base, "RGB")


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt.upper(), **{**FORMATS.get(fmt, {}), **kw})
    return buf.getvalue()


@pytest.fixture(scope="module")
def samples():
    return {fmt: encode(picture(), fmt) for fmt in FORMATS}


def check_prepared(path):
    out = attempt(prepare_image, path, PRE)
    if out.ok:
        image = out.result
        assert np.isfinite(image.pixel_values).all()
        assert image.n_tokens >= 1
    else:
        assert isinstance(out.error, InputError)
        assert str(path) in str(out.error)
    return out


@fuzz(400)
@given(data=st.data())
def test_mutated_images_prepare_or_fail_cleanly(samples, tmp_path_factory, data):
    fmt = data.draw(st.sampled_from(sorted(samples)))
    raw = samples[fmt]
    bad = mutate_bytes(raw, data.draw, hot=min(len(raw), 256))
    path = tmp_path_factory.getbasetemp() / f"fuzz.{fmt}"
    path.write_bytes(bad)
    with watchdog():
        check_prepared(path)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("keep", [0, 1, 10, 0.25, 0.5, 0.9])
def test_truncated_every_format(tmp_path, samples, fmt, keep):
    raw = samples[fmt]
    n = keep if isinstance(keep, int) else int(len(raw) * keep)
    path = tmp_path / f"cut.{fmt}"
    path.write_bytes(raw[:n])
    out = check_prepared(path)
    assert not out.ok, "a cut file must not pass as an image"  # BMP/TIFF included


# ---- decompression bombs ---------------------------------------------------------------------


def _gif_bomb(w, h) -> bytes:
    """A GIF whose screen and frame claim w x h but whose data is a few bytes."""
    head = b"GIF89a" + struct.pack("<HHBBB", w, h, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, w, h, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame + b"\x3b"


def _jpeg_bomb(w, h) -> bytes:
    """A baseline JPEG header (SOF0) claiming w x h, with no scan data."""
    raw = bytearray(encode(picture(16, 16), "jpeg"))
    i = raw.index(b"\xff\xc0")
    struct.pack_into(">HH", raw, i + 5, h, w)
    return bytes(raw)


def _webp_bomb(w, h) -> bytes:
    """A VP8X WebP whose canvas claims w x h."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    vp8x += (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    body = b"WEBP" + vp8x
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(w: int, h: int, depth: int, colour: int, rows: bytes) -> bytes:
    """A PNG written by hand (Pillow cannot save every depth/colour type)."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(rows))
        + _chunk(b"IEND", b"")
    )


def _png_bomb(w, h) -> bytes:
    return _png(w, h, 1, 0, b"\0" * 1000)  # 1-bit grey: few bytes, a gigapixel declared


@pytest.mark.parametrize(
    "name,make",
    [
        ("gif", lambda: _gif_bomb(65535, 65535)),
        ("jpeg", lambda: _jpeg_bomb(65500, 65500)),
        ("webp", lambda: _webp_bomb(16384, 16384)),
        ("png-1bit", lambda: _png_bomb(100_000, 100_000)),
    ],
)
def test_bombs_in_every_format(tmp_path, name, make):
    path = tmp_path / f"bomb.{name.split('-')[0]}"
    path.write_bytes(make())
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        prepare_image(path, PRE)
    assert time.perf_counter() - t0 < 2.0  # refused from the header, nothing decoded
    assert str(path) in str(e.value)


# ---- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(100_000, 2), (2, 100_000)])
def test_100000_by_2(tmp_path, size):
    path = tmp_path / "strip.png"
    Image.new("RGB", size, (1, 2, 3)).save(path)
    with pytest.raises(InputError, match="aspect ratio") as e:
        prepare_image(path, PreprocessConfig())
    assert str(path) in str(e.value)


def test_2x2_is_the_smallest_accepted(tmp_path):
    path = tmp_path / "two.png"
    Image.new("RGB", (2, 2), (200, 10, 10)).save(path)
    image = prepare_image(path, PRE)
    assert image.original_size == (2, 2) and image.n_tokens >= 1


# ---- depth and colour --------------------------------------------------------------------------


def test_16_bit_rgb_png(tmp_path):
    """A 48-bit PNG is read, not refused."""
    w, h = 32, 24
    rows = b"".join(
        b"\0" + b"".join(struct.pack(">HHH", x * 2000, y * 2700, 65535) for x in range(w))
        for y in range(h)
    )
    path = tmp_path / "rgb48.png"
    path.write_bytes(_png(w, h, 16, 2, rows))
    image = prepare_image(path, PRE)
    assert np.isfinite(image.pixel_values).all()
    # the blue channel is full scale everywhere: normalised (1 - 0.5) / 0.5 = 1
    assert np.allclose(image.pixel_values.reshape(-1, 3, 2, 16, 16)[:, 2], 1.0)


@pytest.mark.parametrize("alpha", [False, True])
def test_16_bit_grey_and_grey_alpha_png(tmp_path, alpha):
    """16-bit grey (I;16) is scaled, not clipped to white; 16-bit grey+alpha composites on white
    (alpha 0 on the left half)."""
    w, h = 32, 32
    rows = b""
    for _ in range(h):
        row = b"\0"
        for x in range(w):
            row += struct.pack(">H", (x * 2048) & 0xFFFF)
            if alpha:
                row += struct.pack(">H", 0 if x < 16 else 65535)
        rows += row
    path = tmp_path / "grey16.png"
    path.write_bytes(_png(w, h, 16, 4 if alpha else 0, rows))
    image = prepare_image(path, PreprocessConfig(min_pixels=32 * 32, max_pixels=32 * 32))
    frame = _first_frame(image)
    assert np.isfinite(frame).all()
    right = frame[:, :, 16:]
    assert right.min() < 0.2 and right.max() > 0.8  # a ramp, not all white
    if alpha:
        assert np.allclose(frame[:, :, :16], 1.0)  # transparent -> white
    else:
        assert frame[:, :, :4].max() < -0.7  # dark start of the ramp


def test_cmyk_jpeg(tmp_path):
    path = tmp_path / "cmyk.jpg"
    picture().convert("CMYK").save(path, quality=95)
    assert Image.open(path).mode == "CMYK"
    image = prepare_image(path, PRE)
    rgb = prepare_image(_save(tmp_path, picture(), "ref.png"), PRE)
    assert np.abs(image.pixel_values - rgb.pixel_values).mean() < 0.1


def _save(tmp_path, im, name):
    path = tmp_path / name
    im.save(path)
    return path


@pytest.mark.parametrize("fmt", ["png", "gif"])
def test_palette_with_transparent_index(tmp_path, fmt):
    """Palette index 0 is transparent: those pixels become white, the others keep their colour."""
    p = np.zeros((32, 32), np.uint8)
    p[:, 16:] = 1
    im = Image.fromarray(p, "P")
    im.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    path = tmp_path / f"pal.{fmt}"
    im.save(path, transparency=0)
    image = prepare_image(path, PreprocessConfig(min_pixels=32 * 32, max_pixels=32 * 32))
    frame = _first_frame(image)
    white, red = frame[:, :, :16], frame[:, :, 16:]
    assert np.allclose(white, 1.0)  # (255/255 - 0.5) / 0.5
    assert np.allclose(red[0], 1.0) and np.allclose(red[1:], -1.0)


def _first_frame(image):
    """[3, H, W] of the first temporal frame, undoing the patch order (merge 2, patch 16)."""
    t, gh, gw = image.grid_thw
    a = image.pixel_values.reshape(gh // 2, gw // 2, 2, 2, 3, 2, 16, 16)[:, :, :, :, :, 0]
    return a.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * 16, gw * 16)


# ---- animations: the first frame ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["gif", "webp", "png"])
def test_animation_uses_the_first_frame(tmp_path, fmt):
    colours = [(255, 0, 0), (0, 0, 255), (0, 255, 0)]
    frames = [Image.new("RGB", (32, 32), c) for c in colours]
    path = tmp_path / f"anim.{fmt}"
    kw = {"lossless": True} if fmt == "webp" else {}
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0, **kw)
    with Image.open(path) as im:
        assert getattr(im, "n_frames", 1) == 3  # really animated
    image = prepare_image(path, PreprocessConfig(min_pixels=32 * 32, max_pixels=32 * 32))
    frame = _first_frame(image)
    assert np.allclose(frame[0], 1.0, atol=0.02)  # red
    assert np.allclose(frame[1:], -1.0, atol=0.02)


@pytest.mark.parametrize("dtype", [">u2", "<u2"])
@pytest.mark.parametrize("side", [64, 3000])
def test_16_bit_grey_tiff_in_either_byte_order(tmp_path, dtype, side, monkeypatch):
    """A big-endian 16-bit grey TIFF (Pillow mode I;16B: ImageJ, scientific cameras) is read
    as the little-endian one is, small or reduced on reading; its values scaled to 8 bits
    (Pillow's getextrema cannot read I;16B: it had raised a ValueError past every check, so
    an app attached it and each later question of the chat failed)."""
    from merlin.engine.vision import image_file
    from merlin.engine.vision.preprocess import check_image_file

    monkeypatch.setattr(image_file, "REDUCE_ABOVE", 1 << 20)  # 3000 x 3000 is reduced
    a = np.zeros((side, side), dtype=dtype)
    a[:, side // 2 :] = 65535  # right half white, left black
    path = tmp_path / "grey16.tif"
    Image.fromarray(a).save(path)
    with Image.open(path) as im:
        assert im.mode == ("I;16B" if dtype == ">u2" else "I;16")
    check_image_file(path)
    image = prepare_image(path, PreprocessConfig(min_pixels=32 * 32, max_pixels=32 * 32))
    frame = _first_frame(image)
    assert np.allclose(frame[:, :, :12], -1.0) and np.allclose(frame[:, :, 20:], 1.0)
