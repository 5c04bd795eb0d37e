"""Image placeholders of a rendered chat prompt expanded to the vision token count of each
image (engine.prompt.build_prompt uses it; kept apart so the tokenizer can re-export it)."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import TokenizerError


def expand_image_pads(ids: Sequence[int], image_pad_id: int, counts: Sequence[int]) -> list[int]:
    """Replace the k-th `image_pad_id` in `ids` by `counts[k]` copies (vision tokens of image k).

    The chat template writes one pad per image; the vision encoder yields
    t*h*w/merge_size**2 embeddings per image, and each needs its own position.
    """
    n_pads = sum(1 for i in ids if i == image_pad_id)
    if n_pads != len(counts):
        raise TokenizerError(
            f"The prompt has {n_pads} image placeholder(s) but {len(counts)} image(s) were "
            "given. Attach each image through an image item of a message, once."
        )
    for c in counts:
        if int(c) < 1:
            raise TokenizerError(f"An image must give at least one vision token, got {c}.")
    out: list[int] = []
    k = 0
    for i in ids:
        if i == image_pad_id:
            out.extend([image_pad_id] * int(counts[k]))
            k += 1
        else:
            out.append(i)
    return out
