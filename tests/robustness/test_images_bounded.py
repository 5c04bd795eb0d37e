"""Image decoding is an allow-list and bounded: EPS (Ghostscript) never runs, a header that
promises more decoded memory than MAX_DECODE_BYTES is refused before decoding, and a large
16-bit PNG is prepared with a peak well under 1 GB (measured in a child process), and the
band-wise conversions that keep it there give exactly the whole-image results."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from merlin.engine.errors import InputError
from merlin.engine.vision import image_file
from merlin.engine.vision.preprocess import PIXEL_LIMIT, PreprocessConfig, prepare_image


def test_eps_is_never_decoded(tmp_path, monkeypatch):
    import PIL.EpsImagePlugin as eps

    monkeypatch.setattr(eps, "Ghostscript", lambda *a, **k: pytest.fail("Ghostscript ran"))
    path = tmp_path / "a.eps"
    path.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 100 100\nshowpage\n")
    with pytest.raises(InputError, match="not an image file Merlin can read"):
        prepare_image(path, PreprocessConfig())


def _bmp_header(width: int, height: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 32, 0, 0, 2835, 2835, 0, 0)
    size = 14 + len(info) + 16
    return b"BM" + struct.pack("<IHHI", size, 0, 0, 14 + len(info)) + info + b"\0" * 16


def test_decoded_size_refused_from_the_header(tmp_path):
    path = tmp_path / "big.bmp"
    path.write_bytes(_bmp_header(12000, 12000))  # 144 Mpx x 4 bytes: 576 MB once decoded
    with pytest.raises(InputError, match="decoding it would take"):
        prepare_image(path, PreprocessConfig())


# The child's own peak: VmHWM of its address space. Not ru_maxrss, which Linux carries over
# exec from the process that spawned it (a large pytest parent read as the child's peak).
CHILD = """
import sys
from merlin.engine.vision.preprocess import PreprocessConfig, prepare_image
p = prepare_image(sys.argv[1], PreprocessConfig())
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print(p.grid_thw, int(hwm.split()[1]) * 1024)
"""
MAKE = """
import sys, numpy as np
from PIL import Image
a = np.zeros((9000, 9000), np.uint16); a[::7] = 40000
Image.frombytes("I;16", (9000, 9000), a.tobytes()).save(sys.argv[1])
"""


def test_large_16_bit_png_peak(tmp_path):
    path = tmp_path / "deep.png"
    subprocess.run([sys.executable, "-c", MAKE, str(path)], check=True, timeout=300)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    peak = int(out.stdout.split()[-1])
    assert peak < 1 << 30, f"peak {peak / 1e9:.2f} GB"


MAKE_ALPHA = """
import sys
from PIL import Image
Image.new(sys.argv[2], (10000, 10000)).save(sys.argv[1])
"""


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_large_image_with_alpha_peak(tmp_path, mode):
    """Shrinking a decoded image with alpha goes a band at a time (Pillow's reduce of RGBA
    or LA first makes a premultiplied copy of the whole image: twice the decoded bytes)."""
    path = tmp_path / "alpha.png"
    subprocess.run([sys.executable, "-c", MAKE_ALPHA, str(path), mode], check=True, timeout=300)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    peak = int(out.stdout.split()[-1])
    # 0.96 GB before (whole-image reduce and alpha composite); 0.71 GB with bands, most of it
    # the 400 MB decode and the patches of the 16.7-megapixel budget
    assert peak < 800 << 20, f"peak {peak / 1e9:.2f} GB"


def _random_image(mode: str) -> Image.Image:
    rng = np.random.default_rng(3)
    if mode in ("P", "P+t", "RGB+t"):
        base = mode[0] if mode != "RGB+t" else "RGB"
        a = rng.integers(0, 256, (301, 257, 3), dtype=np.uint8)
        im = Image.fromarray(a, "RGB")
        if base == "P":
            im = im.quantize(64)
        if mode.endswith("+t"):
            im.info["transparency"] = 5 if base == "P" else tuple(int(v) for v in a[0, 0])
        return im
    a = rng.integers(0, 256, (301, 257, len(mode)), dtype=np.uint8)
    return Image.fromarray(a[..., 0] if len(mode) == 1 else a, mode)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "RGB", "L"])
def test_band_reduction_equals_whole_image_reduction(mode, monkeypatch):
    im = _random_image(mode)
    k = 5
    target = im.size[0] * im.size[1] // (k * k)
    monkeypatch.setattr(image_file, "REDUCE_ABOVE", 0)  # reduce this small image too
    assert image_file._reduction(im.size, target) == k
    monkeypatch.setattr(image_file, "_BAND_PIXELS", 2000)  # many bands
    banded = image_file._reduce_after_decode(im, target)
    assert np.array_equal(np.asarray(banded), np.asarray(im.reduce(k)))


@pytest.mark.parametrize("mode", ["RGBA", "LA", "PA", "P+t", "RGB+t"])
def test_alpha_composite_in_bands_equals_whole_image(mode, monkeypatch):
    im = _random_image(mode)
    whole = image_file._on_white(im)
    monkeypatch.setattr(image_file, "_BAND_PIXELS", 2000)
    banded = image_file.to_rgb(im)
    assert banded.mode == "RGB" and np.array_equal(np.asarray(banded), np.asarray(whole))


def _reference_to_l(a: np.ndarray, mode: str) -> np.ndarray:
    """The whole-array conversion the band-wise one must reproduce."""
    if mode == "F":
        with np.errstate(invalid="ignore"):
            top = 255.0 if np.nanmax(a, initial=0.0) > 1.0 else 1.0
        a = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=top, neginf=0.0)
        return np.clip(np.rint(a * (255.0 / top)), 0, 255).astype(np.uint8)
    if mode == "I" and a.min() >= 0 and a.max() <= 255:
        return a.astype(np.uint8)
    return ((np.clip(a.astype(np.int64), 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)


@pytest.mark.parametrize("mode", ["I;16", "I", "I-small", "F", "F-small"])
@pytest.mark.parametrize("k", [1, 3])
def test_high_depth_bands_equal_the_whole_image(monkeypatch, mode, k):
    monkeypatch.setattr(image_file, "_BAND_PIXELS", 7 * 61)  # 7 rows a band (6 when k = 3)
    rng = np.random.default_rng(0)
    shape = (50, 61)
    if mode == "I;16":
        a = rng.integers(0, 65536, shape).astype("<u2")
        im = Image.frombytes("I;16", shape[::-1], a.tobytes())
    elif mode.startswith("I"):
        a = rng.integers(-5 if mode == "I" else 0, 70000 if mode == "I" else 256, shape)
        im = Image.fromarray(a.astype(np.int32), "I")
    else:
        a = rng.random(shape, dtype=np.float32) * (300 if mode == "F" else 1)
        a[3, 4], a[40, 2], a[49, 60] = np.nan, np.inf, -np.inf
        im = Image.fromarray(a, "F")
    want = Image.fromarray(_reference_to_l(a, im.mode), "L").reduce(k)
    got = image_file._high_depth_to_l(im, k)
    assert got.mode == "L" and got.size == want.size
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_palette_bands_equal_the_whole_image(monkeypatch):
    monkeypatch.setattr(image_file, "_BAND_PIXELS", 5 * 47)
    rng = np.random.default_rng(1)
    im = Image.fromarray(rng.integers(0, 16, (43, 47)).astype(np.uint8), "P")
    im.putpalette(rng.integers(0, 256, 48).astype(np.uint8).tobytes())
    im.info["transparency"] = 3
    want = im.convert("RGBA").reduce(4)
    got = image_file._in_bands(im, 4, "RGBA", lambda band: band.convert("RGBA"))
    assert np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    "size, target",
    [
        ((6000, 4000), 1 << 20),
        ((9000, 9000), PIXEL_LIMIT),
        ((12000, 10000), 802816),
        ((5000, 5001), 1),
    ],
)
def test_reduction_keeps_ordinary_photos_and_the_budget(size, target):
    """Images up to REDUCE_ABOVE pixels keep the reference's exact resize; larger ones shrink
    only while they still hold the pixel budget (the exact resize stays a downscale)."""
    k = image_file._reduction(size, target)
    pixels = size[0] * size[1]
    if pixels <= image_file.REDUCE_ABOVE:
        assert k == 1
    else:
        assert k >= 1 and (size[0] // k) * (size[1] // k) >= min(target, pixels) * 0.99
        assert ((size[0] // (k + 1)) * (size[1] // (k + 1))) < target  # and no further


def test_patchify_in_passes_equals_one_pass(monkeypatch):
    from merlin.engine.vision import preprocess

    rng = np.random.default_rng(2)
    u8 = rng.integers(0, 256, (96, 128, 3)).astype(np.uint8)
    cfg = PreprocessConfig()
    lut = preprocess._lut(cfg)
    whole, grid = preprocess.patchify(u8, lut, cfg)
    monkeypatch.setattr(preprocess, "PATCHIFY_BYTES", 1)  # one merge-block row a pass
    passes, grid2 = preprocess.patchify(u8, lut, cfg)
    assert grid == grid2 and np.array_equal(whole, passes)
