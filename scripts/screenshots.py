"""Take the README's screenshots (docs/screenshots/): the window on the demo model at
1280x720 and 1920x1080 in demo mode (F10), English and Chinese, with a conversation, a
picture, the performance panel and a draft counted by the context meter.

    xvfb-run -a -s "-screen 0 1920x1080x24" .venv/bin/python scripts/screenshots.py

Each shot runs in its own process (merlin.app.modes.screenshot.run, a scratch data folder)
on the real X server Xvfb provides (QT_QPA_PLATFORM=xcb, the fonts of the system: Chinese
needs fonts-noto-cjk). PNGs are reduced to 256 colours without dithering (flat UI colours and
anti-aliased text survive it; a third of the size), so the repository stays small.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
SHOTS = [
    ((1280, 720), "en"),
    ((1280, 720), "zh_CN"),
    ((1920, 1080), "en"),
    ((1920, 1080), "zh_CN"),
]
DRAFT = {"en": "And what shape is green?", "zh_CN": "绿色的是什么形状？"}
CODE = """
import sys
from merlin.app.modes.screenshot import run
w, h, lang, draft, path = sys.argv[1:]
sys.exit(run(path, size=(int(w), int(h)), language=lang, demo=True, draft=draft))
"""


def main() -> int:
    from PIL import Image

    OUT.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "xcb"))
    for (w, h), lang in SHOTS:
        path = OUT / f"demo-{w}x{h}-{lang.split('_')[0]}.png"
        args = [sys.executable, "-c", CODE, str(w), str(h), lang, DRAFT[lang], str(path)]
        if subprocess.run(args, env=env).returncode != 0:
            return 1
        image = Image.open(path).convert("RGB")
        image.quantize(256, dither=Image.Dither.NONE).save(path, optimize=True)
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
