"""The image side of a loaded model: preprocessing settings + the encoder, or why there is none.

A checkpoint without usable vision weights still loads (text chat works); the reason is kept
and raised as a CheckpointError the moment an image is used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoint import Checkpoint
from ..config import ModelConfig
from ..errors import CheckpointError, InputError
from . import cost, qweights
from .embed_cache import EmbeddingCache
from .encoder import VisionEncoder, VisionOutput
from .preprocess import PreparedImage, PreprocessConfig, load_preprocess_config, prepare_image
from .weights import load_vision_weights, vision_tensor_problem


@dataclass
class ImageInputs:
    """What the text decoder needs for the images of one prompt."""

    embeds: np.ndarray  # [M, D] rows replacing the image pads, in prompt order
    rows: np.ndarray  # [M] int64 indexes of the image pads in the prompt
    deepstack: list[np.ndarray]  # [M, D] each, added after decoder layers 0, 1, ...
    vision_ms: float
    output: VisionOutput


class VisionModel:
    def __init__(
        self,
        config: ModelConfig,
        preprocess: PreprocessConfig,
        encoder: VisionEncoder | None,
        problem: str | None = None,
    ):
        self.config = config
        self.preprocess = preprocess
        self.encoder = encoder
        self.problem = problem if encoder is None else None
        self._encodes = 0
        self.embeddings = EmbeddingCache()  # shared by sessions (engine/vision/embed_cache.py)

    @property
    def available(self) -> bool:
        return self.encoder is not None

    def require(self) -> VisionEncoder:
        if self.encoder is None:
            raise CheckpointError(self.problem or "this model has no vision encoder.")
        return self.encoder

    def prepare(self, path: Path | str, max_pixels: int | None = None) -> PreparedImage:
        """Image file -> PreparedImage (InputError naming the file when it is unusable)."""
        self.require()
        return prepare_image(path, self.preprocess, max_pixels)

    def set_weights_format(self, fmt: str | None) -> None:
        """'f32' or 'q8' for the encoder's matrices; None: q8 where the shapes allow it (a
        matrix whose input width is not a multiple of 32 stays f32)."""
        if self.encoder is None:
            return
        if fmt is None:
            fmt = "q8" if qweights.quantizable(self.encoder.w.stored) else "f32"
        self.encoder.set_weights_format(fmt)

    @property
    def weights_format(self) -> str:
        return self.encoder.weights_format if self.encoder is not None else "f32"

    def encode(self, images: list[PreparedImage], cancel=None, progress=None) -> VisionOutput:
        """Run the encoder (cancel: an Event checked between blocks, EncodeCancelled;
        progress(done, depth) after each block) and record its speed (engine/vision/cost.py)."""
        enc = self.require()
        if not images:
            raise ValueError("encode() needs at least one image")
        pixels = np.concatenate([im.pixel_values for im in images])
        out = enc.forward(pixels, [im.grid_thw for im in images], cancel, progress)
        self._encodes += 1
        if self._encodes > 1:  # the first one of a process also compiles or loads kernels
            cost.record(enc, out, pixels.shape[0])
        return out

    def estimate_seconds(self, width: int, height: int, tokens: int | None) -> float:
        """Predicted encode time of a width x height picture at this budget, here."""
        enc = self.require()
        return cost.estimate_seconds(enc, [cost.grid_for(width, height, self.preprocess, tokens)])

    def prompt_inputs(self, prompt_ids, images: list[PreparedImage]) -> ImageInputs:
        """Run the encoder and place its outputs at the image pads of prompt_ids."""
        t0 = time.perf_counter()
        ids = np.asarray(prompt_ids)
        rows = np.flatnonzero(ids == self.config.image_token_id)
        want = sum(im.n_tokens for im in images)
        if len(rows) != want:
            raise InputError(
                f"the prompt has {len(rows)} image tokens but its {len(images)} image(s) need "
                f"{want}; build the prompt with the same images (engine.prompt.build_prompt)."
            )
        out = self.encode(images)
        return ImageInputs(
            embeds=out.embeds,
            rows=rows,
            deepstack=out.deepstack,
            vision_ms=(time.perf_counter() - t0) * 1e3,
            output=out,
        )


def load_vision(folder: Path, ckpt: Checkpoint, config: ModelConfig) -> VisionModel:
    """Load the vision encoder when the checkpoint has one; otherwise remember why not."""
    try:
        preprocess = load_preprocess_config(folder)
    except CheckpointError as e:
        return VisionModel(config, PreprocessConfig(), None, f"{e} Images cannot be used.")
    v = config.vision
    if v is None:
        return VisionModel(
            config,
            preprocess,
            None,
            f"{folder}: config.json has no vision_config, so this model cannot look at images. "
            "Use a Qwen3-VL checkpoint to ask about images; text chat works as it is.",
        )
    mismatch = [
        (name, a, b)
        for name, a, b in (
            ("patch_size", preprocess.patch_size, v.patch_size),
            ("temporal_patch_size", preprocess.temporal_patch_size, v.temporal_patch_size),
            ("merge_size", preprocess.merge_size, v.spatial_merge_size),
        )
        if a != b
    ]
    if mismatch or v.in_channels != 3:
        what = (
            f"{mismatch[0][0]} is {mismatch[0][1]} in preprocessor_config.json but "
            f"{mismatch[0][2]} in config.json"
            if mismatch
            else f"vision in_channels is {v.in_channels}, expected 3"
        )
        return VisionModel(
            config,
            preprocess,
            None,
            f"{folder}: {what}; images cannot be used with this checkpoint. Restore the "
            "original files; text chat works as it is.",
        )
    problem = vision_tensor_problem(ckpt, v)
    if problem:
        return VisionModel(config, preprocess, None, problem)
    return VisionModel(config, preprocess, VisionEncoder(v, load_vision_weights(ckpt, v)))
