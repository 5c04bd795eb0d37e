"""A session's images: intake (paths, PIL images, PreparedImage -> SessionImage) and the
embedding cache keyed by content hash.

An image already encoded is never encoded again while a message of the conversation uses it,
even when the rows around it must be recomputed (an edit before it, older turns dropped).
Pixels are dropped once the embedding is cached; an image whose embedding is not cached and
whose pixels are gone (a session restored for another model) is prepared again from its file,
which must be unchanged (same content hash).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, MerlinError
from ..prompt import image_hash
from ..vision.encoder import VISION_WEIGHTS
from .conversation import SessionImage


@dataclass
class ImageEmbedding:
    embeds: np.ndarray  # [n, D] rows replacing the image pads
    deepstack: np.ndarray  # [levels, n, D] added after decoder layers 0, 1, ...


def _salt(vision, max_px, weights_format: str | None = None) -> str:
    """What besides the pixels keys an embedding: the budget and the vision weights format
    (the model's unless given)."""
    return f"{weights_format or vision.weights_format}/{max_px}"


class ImageBank:
    """Images of one session with one model. The budget of a new image: its own (a
    vision.budget.BudgetedImage), else image_tokens, else the legacy max_pixels, else the
    machine's default, within `context` tokens (engine/vision/budget.py); the session keeps
    these current. A picture whose tokens alone exceed the context is refused before any
    encoding. Embeddings are also shared with the model's other sessions
    (model.vision.embeddings: an image encoded when it was attached is not encoded again).
    cancel / progress: what the next encodes check between blocks and report to."""

    def __init__(self, model, max_pixels: int | None = None, image_tokens: int | None = None):
        self.model = model
        self.max_pixels = max_pixels
        self.image_tokens = image_tokens
        self.context: int | None = None
        self.cancel = None  # threading.Event: EncodeCancelled between encoder blocks
        self.progress = None  # progress(blocks done, depth) while an image is encoded
        self.embeddings: dict[str, ImageEmbedding] = {}
        self._memo: dict[tuple, SessionImage] = {}

    def _budget(self, image) -> int | None:
        """The pixel budget an image is prepared with."""
        from ..vision import budget

        own = image.tokens if isinstance(image, budget.BudgetedImage) else None
        pre = self.model.vision.preprocess
        try:
            max_px, _ = budget.resolve(pre, own, self.image_tokens, self.max_pixels, self.context)
        except budget.InvalidBudget as e:
            if own is None or getattr(image, "strict", True):
                raise
            max_px, _ = budget.resolve(pre, e.nearest, None, None, self.context)
        return max_px

    def image(self, image) -> SessionImage:
        """A path, PIL image, PreparedImage or SessionImage -> SessionImage (prepared now with
        the pixel budget; InputError naming the file when it is unusable)."""
        if isinstance(image, SessionImage):
            if image.prepared is None and image.hash not in self.embeddings and image.source:
                # neither pixels nor embedding (a session restored without its cache): the
                # file prepared again at its own budget, which must give the same pixels
                # (an edit had gone on with a changed file where ask() refused it)
                if not Path(image.source).is_file():
                    return image  # the embedding step says what is missing, if needed
                try:
                    prepared = self.model.vision.prepare(image.source, image.budget)
                except MerlinError:
                    return image
                self._check_unchanged(prepared, image)
                return self._wrap(prepared, image.source, image.budget)
            return image
        vision = self.model.vision
        if vision is None:
            raise InputError("this model has no vision encoder; remove the image.")
        vision.require()
        max_px = self._budget(image)
        if isinstance(image, (str, os.PathLike)):
            path = Path(os.path.expanduser(image))
            try:
                st = path.stat()
                key = (str(path.resolve()), st.st_mtime_ns, st.st_size, max_px)
            except (OSError, ValueError):  # ValueError: a NUL in the name
                key = None  # prepare() says what is wrong with the path
            if key in self._memo:
                return self._memo[key]
            prepared = vision.prepare(path, max_px)
            im = self._wrap(prepared, str(path), max_px)
            if key is not None:
                if len(self._memo) > 64:
                    self._memo.clear()
                self._memo[key] = im
            return im
        if hasattr(image, "pixel_values") and hasattr(image, "grid_thw"):
            return self._wrap(image, getattr(image, "source", ""), self.max_pixels)
        try:
            from PIL import Image
        except ImportError:  # pragma: no cover
            Image = None
        if Image is not None and isinstance(image, Image.Image):
            from ..vision import prepare_pil

            cfg = vision.preprocess.with_max_pixels(max_px)
            return self._wrap(prepare_pil(image, cfg, "image"), "image", max_px)
        raise InputError(f"cannot use {type(image).__name__} as an image; give a file path.")

    def _wrap(self, prepared, source: str, max_px: int | None) -> SessionImage:
        from ..vision.budget import check_image_fits

        vision = self.model.vision
        im = SessionImage(
            image_hash(prepared, _salt(vision, max_px)),
            tuple(int(v) for v in prepared.grid_thw),
            int(prepared.merge_size),
            str(source),
            prepared,
            max_px,
        )
        if self.context:  # refused before any encoding, with the numbers
            check_image_fits(im.n_tokens, self.context, vision.preprocess, str(source))
        return im

    def embedding(self, im: SessionImage) -> tuple[np.ndarray, np.ndarray]:
        """(embeds [n, D], deepstack [levels, n, D]) of an image, encoded on its own the first
        time it is needed."""
        shared = self.model.vision.embeddings  # the model's sessions and encode-on-attach
        emb = self.embeddings.get(im.hash) or shared.get(im.hash)
        if emb is not None:
            self.embeddings[im.hash] = emb
        else:
            prepared = im.prepared if im.prepared is not None else self._reprepare(im)
            out = self.model.vision.encode([prepared], self.cancel, self.progress)
            if out.embeds.shape[0] != im.n_tokens:
                raise MerlinError(
                    f"the vision encoder gave {out.embeds.shape[0]} rows for an image of "
                    f"{im.n_tokens} tokens."
                )
            deep = (
                np.stack(out.deepstack)
                if out.deepstack
                else np.zeros((0, *out.embeds.shape), np.float32)
            )
            emb = ImageEmbedding(out.embeds, deep)
            self.embeddings[im.hash] = emb
            shared.put(im.hash, emb)
            im.prepared = None  # the pixels are not needed while the embedding is kept
        return emb.embeds, emb.deepstack

    def _reprepare(self, im: SessionImage):
        """Pixels of an image whose embedding is not cached (e.g. a session restored from
        another model's file): prepared again from its file, which must be unchanged. Its
        hash may have been made under another vision weights format (a file saved with
        q8 vision weights, restored with f32): the pixels are what must match."""
        if not im.source or not Path(im.source).is_file():
            raise InputError(
                f"the image {im.source or '(unnamed)'} of this conversation is needed again "
                "but its file is gone and no saved copy could be used. Attach it again in a "
                "new message, or start a new chat."
            )
        prepared = self.model.vision.prepare(im.source, im.budget)
        self._check_unchanged(prepared, im)
        return prepared

    def _check_unchanged(self, prepared, im: SessionImage) -> None:
        """InputError unless `prepared` has im's pixels (its hash may have been made under
        another vision weights format: a file saved with q8 vision weights, opened with
        f32)."""
        hashes = {
            image_hash(prepared, _salt(self.model.vision, im.budget, f)) for f in VISION_WEIGHTS
        }
        if im.hash not in hashes:
            raise InputError(
                f"the image {im.source} changed on disk since it was attached to this "
                "conversation. Attach it again in a new message, or start a new chat."
            )

    def keep_only(self, used: Iterable[str]) -> None:
        """Forget the embeddings of images no message uses any more."""
        used = set(used)
        for h in list(self.embeddings):
            if h not in used:
                del self.embeddings[h]
