"""Image decoding is an allow-list and bounded: EPS (Ghostscript) never runs, a header that
promises more decoded memory than MAX_DECODE_BYTES is refused before decoding, and a large
16-bit PNG is prepared with a peak well under 1 GB (measured in a child process)."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from merlin.engine.errors import InputError
from merlin.engine.vision.preprocess import PreprocessConfig, prepare_image


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
