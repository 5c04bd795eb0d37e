"""Images the user attaches: checked and thumbnailed when attached, so a bad file is reported
at once, next to the composer, and never reaches the engine.

read_image does the file work (checks, decoding a thumbnail, converting a format the engine
cannot read) and runs on any thread: the composer runs it on a worker, since decoding a
180 Mpx PNG for its thumbnail takes over a second (a PNG has no scaled decoding). Its result
holds a QImage; to_attachment makes the QPixmap a chip shows, on the GUI thread (Qt allows
QImage on other threads, not QPixmap)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt
from PySide6.QtGui import QImage, QImageReader, QPixmap

from merlin.app.i18n import tr
from merlin.app.model.paths import data_dir
from merlin.engine.errors import InputError
from merlin.engine.tokenizer import clean_text
from merlin.engine.vision.preprocess import check_image_file

THUMB = 64
MAX_FILE_BYTES = 64 << 20
# Qt format names of what engine.vision.image_file.IMAGE_FORMATS decodes
ENGINE_FORMATS = {"png", "jpeg", "jpg", "webp", "gif", "bmp", "tif", "tiff"}
MAX_PIXELS = 180_000_000  # Pillow's decompression-bomb limit, which the engine applies too
IMAGE_SUFFIXES = {
    ".png",
    ".jpg",
    ".jpeg",
    ".jfif",
    ".webp",
    ".gif",
    ".bmp",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
    ".pbm",
}


@dataclass
class ReadImage:
    """A checked image file and its thumbnail, from read_image (any thread)."""

    path: str
    name: str
    thumbnail: QImage
    size: tuple[int, int]
    stored: object = None  # what the composer's store_file made of it (an ImageRef)
    detail: str = ""  # the detail it is to have when attached (a draft put back)


@dataclass
class Attachment:
    path: str
    name: str
    thumbnail: QPixmap
    size: tuple[int, int]
    stored: object = None  # the image's copy in the chat store, made while it was read
    detail: str = ""  # its chip's detail menu: "" (the settings' default), "fast", ...


class AttachmentError(Exception):
    """A file that cannot be attached; the message is for the user (translated)."""


def to_attachment(read: ReadImage) -> Attachment:
    """The chip's pixmap from a read image (GUI thread only)."""
    thumbnail = QPixmap.fromImage(read.thumbnail)
    return Attachment(read.path, read.name, thumbnail, read.size, read.stored, read.detail)


def _check_for_engine(path: Path, name: str) -> None:
    """AttachmentError for a file the engine would refuse when asked about it (a truncated
    JPEG, which Qt shows grey-filled; a 1000x4 strip): a chat never holds a picture no later
    question could use (engine.vision.preprocess.check_image_file)."""
    try:
        check_image_file(path)
    except InputError as e:
        reason = str(e).removeprefix(f"{path}: ")  # the engine's message names the full path
        why = tr("{name} was not attached: {why}").format(name=name, why=reason)
        raise AttachmentError(why) from None


def read_image(path: str | Path, name: str | None = None) -> ReadImage:
    """Check the file and decode its thumbnail (any thread); AttachmentError says what is
    wrong, for the user."""
    path = Path(path)
    name = clean_text(name or path.name)  # a name's bytes that are not UTF-8: U+FFFD
    if path.is_dir():
        raise AttachmentError(tr("{name} is a folder, not an image.").format(name=name))
    if not path.exists():
        raise AttachmentError(tr("{name} cannot be found.").format(name=name))
    if not path.is_file():  # a FIFO or device: never opened (it could block)
        raise AttachmentError(
            tr("{name} is not a regular file (a pipe or a device); it was not attached.").format(
                name=name
            )
        )
    if path.stat().st_size > MAX_FILE_BYTES:
        raise AttachmentError(
            tr("{name} is larger than {mb} MB; attach a smaller image.").format(
                name=name, mb=MAX_FILE_BYTES >> 20
            )
        )
    try:  # Qt's reader says only "cannot read", which the checks below call damaged
        path.open("rb").close()
    except OSError as e:
        raise AttachmentError(
            tr("{name} cannot be read ({why}); it was not attached.").format(
                name=name, why=e.strerror or e
            )
        ) from None
    allow_engine_sized_images()
    reader = image_reader(path)
    if not reader.canRead():
        if path.suffix.lower() in IMAGE_SUFFIXES:
            raise AttachmentError(
                tr("{name} is damaged or not really an image; it was not attached.").format(
                    name=name
                )
            )
        raise AttachmentError(
            tr(
                "{name} is not an image Merlin can use. Attach PNG, JPEG, WebP, GIF, BMP or TIFF."
            ).format(name=name)
        )
    fmt = bytes(reader.format()).decode("ascii", "replace").lower()  # empty after read()
    size = reader.size()
    if size.isValid() and size.width() * size.height() > MAX_PIXELS:
        raise AttachmentError(
            tr("{name} is {w}x{h} pixels, too large to open safely. Scale it down first.").format(
                name=name, w=size.width(), h=size.height()
            )
        )
    if size.isValid() and min(size.width(), size.height()) < 2:
        raise AttachmentError(
            tr("{name} is only {w}x{h} pixels; there is nothing to see.").format(
                name=name, w=size.width(), h=size.height()
            )
        )
    if fmt in ENGINE_FORMATS:
        _check_for_engine(path, name)
    if size.isValid():
        reader.setScaledSize(size.scaled(QSize(THUMB * 2, THUMB * 2), Qt.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        raise AttachmentError(
            tr("{name} could not be read ({why}); it was not attached.").format(
                name=name, why=reader.errorString()
            )
        )
    if fmt not in ENGINE_FORMATS:
        # Qt reads it (SVG, ICO, PPM...) but the engine decodes only ENGINE_FORMATS: convert
        # it to PNG now, so the chat never holds an image no later question could use
        path = _converted_png(path, name)
        _check_for_engine(path, name)
    return ReadImage(
        str(path), name, image, (size.width(), size.height()) if size.isValid() else (0, 0)
    )


def allow_engine_sized_images() -> None:
    """Qt refuses to decode images over 256 MB (64 Mpx at 4 bytes a pixel), a PNG even for a
    thumbnail (it has no scaled decoding); the engine takes up to MAX_PIXELS: raise Qt's
    process-wide limit to that (an image past it is refused by its size, with a message)."""
    needed = -(-MAX_PIXELS * 4 // (1 << 20)) + 1
    if 0 < QImageReader.allocationLimit() < needed:
        QImageReader.setAllocationLimit(needed)


def image_reader(path: str | Path) -> QImageReader:
    """Qt's reader of an image file, EXIF orientation applied. A name whose bytes are not
    UTF-8 (a str holding surrogate escapes) cannot be a QString, so that file is read through
    its bytes in memory (files here are at most MAX_FILE_BYTES)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        buffer = QBuffer()
        buffer.setData(QByteArray(Path(path).read_bytes()))
        buffer.open(QIODevice.ReadOnly)
        reader = QImageReader(buffer)
        reader.buffer = buffer  # alive as long as the reader
    else:
        reader = QImageReader(str(path))
    reader.setAutoTransform(True)
    return reader


def _converted_png(path: Path, name: str) -> Path:
    reader = image_reader(path)
    image = reader.read()
    if image.isNull() or min(image.width(), image.height()) < 2:
        raise AttachmentError(
            tr("{name} could not be converted to PNG ({why}); it was not attached.").format(
                name=name, why=reader.errorString()
            )
        )
    return save_pasted_image(image)


def save_pasted_image(image: QImage | bytes, ext: str = "png") -> Path:
    """A pasted image in the data folder's scratch space (imported into the store when the
    message is sent): a QImage saved as PNG, or an image file's bytes as they are."""
    folder = data_dir() / "scratch"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"pasted-{uuid.uuid4().hex[:12]}.{ext}"
    if isinstance(image, bytes):
        try:
            path.write_bytes(image)
        except OSError as e:
            raise AttachmentError(
                tr("The pasted image could not be saved ({why}).").format(why=e.strerror or e)
            ) from None
    elif not image.save(str(path), "PNG"):
        raise AttachmentError(tr("The pasted image could not be saved."))
    return path


def clear_scratch() -> None:
    folder = data_dir() / "scratch"
    if folder.is_dir():
        for p in folder.iterdir():
            try:
                p.unlink()
            except OSError:
                pass
