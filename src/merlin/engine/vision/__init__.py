"""Images for Qwen3-VL: preprocessing (Pillow) and the vision encoder (NumPy BLAS + Numba).

Typical use, with a loaded `engine.model.Model`: `model.vision.prepare(path, max_pixels)` gives
a PreparedImage; `engine.prompt.build_prompt(tokenizer, config, text, images)` gives the ids
with expanded image pads, 3D positions, the rope delta and image spans; `engine.generate`
(generate, or image_inputs) runs the encoder and places its outputs at the pads.
"""

from .encoder import VisionEncoder, VisionOutput
from .image_file import open_image
from .model import ImageInputs, VisionModel, load_vision
from .preprocess import (
    PreparedImage,
    PreprocessConfig,
    load_preprocess_config,
    prepare_image,
    prepare_pil,
    smart_resize,
)
from .weights import expected_vision_tensors, load_vision_weights

__all__ = [
    "ImageInputs",
    "PreparedImage",
    "PreprocessConfig",
    "VisionEncoder",
    "VisionModel",
    "VisionOutput",
    "expected_vision_tensors",
    "load_preprocess_config",
    "load_vision",
    "load_vision_weights",
    "open_image",
    "prepare_image",
    "prepare_pil",
    "smart_resize",
]
