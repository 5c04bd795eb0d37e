"""Image references of a request (`image_url.url`) -> image files the engine can open.

- `data:image/...;base64,...`: decoded (at most Limits.max_image_bytes) and written to a
  content-addressed file (its SHA-256) in the server's private image folder, so the same
  picture sent again is the same file: the engine session's memo of prepared images and its
  embedding cache (keyed by pixel content) both hit, and nothing is decoded or encoded twice.
  The folder is bounded (oldest files deleted past max_bytes) and removed at shutdown.
- a path or `file://` URL: only inside the folder given with `--allow-images DIR` (after
  resolving symbolic links and `..`); anything else is refused, as is every path when no
  folder was allowed.
- `http://`, `https://` and other schemes: refused, the server never reaches the network.

Pixels are then bounded by the engine itself (Pillow's decompression-bomb limit when the file
is opened, the pixel budget when it is resized).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlparse

from .errors import ApiError

_DATA = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,", re.I)


def _base64_text(payload: str) -> str:
    """A data: URL's payload as browsers read it (WHATWG "forgiving-base64"): percent-escapes
    and ASCII whitespace anywhere are allowed (line-wrapped base64: `base64`, MIME), and so
    is leaving out the final "=" padding; the plain base64 letters, padded again.
    binascii.Error if it is not base64."""
    raw = re.sub(r"[\t\n\f\r ]", "", unquote(payload))
    if len(raw) % 4 == 0 and raw.endswith("="):
        raw = raw[:-2] if raw.endswith("==") else raw[:-1]
    if len(raw) % 4 == 1 or "=" in raw:
        raise binascii.Error("not base64")
    return raw + "=" * (-len(raw) % 4)


@contextmanager
def _unusable_path(param: str):
    """What the file system says of a path no file can have (a NUL byte, a name too long, an
    unknown ~user, a symbolic-link loop, no permission) -> ApiError 400 on the field, not 500.
    The path itself is left out of the message: it may be thousands of characters long."""
    try:
        yield
    except (OSError, ValueError, RuntimeError) as e:
        why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).rstrip(".")
        raise ApiError(f"'{param}': not a usable file path ({why}).", param) from None


_MB = 1 << 20  # the unit of --max-image-mb


class ImageResolver:
    def __init__(
        self,
        allowed_dir: Path | str | None,
        max_image_bytes: int,
        folder: Path | str | None = None,
        max_bytes: int = 512 * 1024 * 1024,
    ):
        self.allowed = Path(os.path.expanduser(allowed_dir)).resolve() if allowed_dir else None
        self.max_image_bytes = int(max_image_bytes)
        self._own = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="merlin-serve-images-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.folder, ignore_errors=True)

    def resolve(self, url: str, param: str) -> Path:
        low = url[:16].lower()
        if low.startswith("data:"):
            return self._data(url, param)
        if low.startswith(("http://", "https://")):
            raise ApiError(
                f"'{param}': Merlin's server does not fetch images from the network; send the "
                "image itself as a data: URL (data:image/png;base64,...).",
                param,
                code="image_url_not_allowed",
            )
        if low.startswith("file:"):
            parsed = urlparse(url)
            if parsed.netloc not in ("", "localhost"):
                raise ApiError(f"'{param}': only local file: URLs are accepted.", param)
            path = os.fsdecode(unquote_to_bytes(parsed.path))  # a name's bytes, UTF-8 or not
        elif re.match(r"^[a-z][a-z0-9+.-]*://", low):
            raise ApiError(
                f"'{param}': unsupported URL scheme; send a data: URL or a file path.", param
            )
        else:
            path = url
        return self._file(path, param)

    def _file(self, path: str, param: str) -> Path:
        if self.allowed is None:
            raise ApiError(
                f"'{param}': this server accepts no image file paths; send the image as a "
                "data: URL, or start the server with --allow-images DIR.",
                param,
                code="image_url_not_allowed",
            )
        with _unusable_path(param):
            p = Path(os.path.expanduser(path))
            if not p.is_absolute():
                p = self.allowed / p
            real = p.resolve()
        if not real.is_relative_to(self.allowed):
            raise ApiError(
                f"'{param}': {path} is outside the folder this server may read images from "
                f"({self.allowed}).",
                param,
                code="image_url_not_allowed",
            )
        with _unusable_path(param):
            size = real.stat().st_size if real.is_file() else None
            exists = size is not None or real.exists()
        if size is None:
            what = "not a regular file (a folder, a pipe or a device)" if exists else "no such file"
            raise ApiError(f"'{param}': {path}: {what}; give an image file.", param)
        if size > self.max_image_bytes:
            raise ApiError(self._too_big(param, size), param, status=413)
        return real

    def _too_big(self, param: str, size: int) -> str:
        return (
            f"'{param}': the image is {size / _MB:.1f} MB; this server accepts images up to "
            f"{self.max_image_bytes / _MB:.1f} MB. Scale it down and send it again."
        )

    def _data(self, url: str, param: str) -> Path:
        m = _DATA.match(url)
        if not m:
            raise ApiError(
                f"'{param}': a data: URL must be base64 (data:image/png;base64,...).", param
            )
        try:
            text = _base64_text(url[m.end() :])
            if len(text) * 3 // 4 > self.max_image_bytes + 3:  # not decoded then
                raise ApiError(self._too_big(param, len(text) * 3 // 4), param, status=413)
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(f"'{param}': the data: URL is not valid base64.", param) from None
        if len(data) > self.max_image_bytes:
            raise ApiError(self._too_big(param, len(data)), param, status=413)
        if not data:
            raise ApiError(f"'{param}': the data: URL holds no image.", param)
        path = self.folder / f"{hashlib.sha256(data).hexdigest()[:32]}.img"
        if not path.is_file():
            self._make_room(len(data))
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return path

    def _make_room(self, incoming: int) -> None:
        files = sorted(self.folder.glob("*.img"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files) + incoming
        for p in files:
            if total <= self.max_bytes:
                break
            total -= p.stat().st_size
            p.unlink(missing_ok=True)

    def describe(self, path: Path) -> str:
        """How an error message names an image: data: URL images have no name of their own."""
        return "the data: URL image" if path.parent == self.folder else str(path)
