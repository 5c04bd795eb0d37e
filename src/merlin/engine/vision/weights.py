"""The vision encoder's weights: which tensors a config implies, why a checkpoint's cannot be
loaded, and loading them.

Vectors, the patch embedding and the position table are read as float32 and held in memory;
the block and merger matrices stay in the file as StoredWeight (read with pread, never mapped:
engine/vision/stored.py says why) and are widened or quantized per encode. Every name, shape
and dtype is checked against the config before anything is read, and NaN/Inf is refused once,
with the tensor's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoint import FLOAT_DTYPES, Checkpoint
from ..config import VisionConfig
from ..errors import CheckpointError
from .stored import StoredWeight, WeightFile

PREFIX = "model.visual."


def expected_vision_tensors(v: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape for every vision tensor."""
    vd, vi, out = v.hidden_size, v.intermediate_size, v.out_hidden_size
    m = vd * v.spatial_merge_size**2
    names: dict[str, tuple[int, ...]] = {
        PREFIX + "patch_embed.proj.weight": (
            vd,
            v.in_channels,
            v.temporal_patch_size,
            v.patch_size,
            v.patch_size,
        ),
        PREFIX + "patch_embed.proj.bias": (vd,),
        PREFIX + "pos_embed.weight": (v.num_position_embeddings, vd),
    }
    for i in range(v.depth):
        p = f"{PREFIX}blocks.{i}."
        names.update(
            {
                p + "norm1.weight": (vd,),
                p + "norm1.bias": (vd,),
                p + "norm2.weight": (vd,),
                p + "norm2.bias": (vd,),
                p + "attn.qkv.weight": (3 * vd, vd),
                p + "attn.qkv.bias": (3 * vd,),
                p + "attn.proj.weight": (vd, vd),
                p + "attn.proj.bias": (vd,),
                p + "mlp.linear_fc1.weight": (vi, vd),
                p + "mlp.linear_fc1.bias": (vi,),
                p + "mlp.linear_fc2.weight": (vd, vi),
                p + "mlp.linear_fc2.bias": (vd,),
            }
        )
    mergers = [PREFIX + "merger."] + [
        f"{PREFIX}deepstack_merger_list.{k}." for k in range(len(v.deepstack_visual_indexes))
    ]
    for k, p in enumerate(mergers):
        norm = vd if k == 0 else m  # the main merger normalises before the 2x2 shuffle
        names.update(
            {
                p + "norm.weight": (norm,),
                p + "norm.bias": (norm,),
                p + "linear_fc1.weight": (m, m),
                p + "linear_fc1.bias": (m,),
                p + "linear_fc2.weight": (out, m),
                p + "linear_fc2.bias": (out,),
            }
        )
    return names


STORED_SUFFIXES = ("attn.qkv.weight", "attn.proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def is_stored_matrix(name: str) -> bool:
    """Block and merger matrices: left in the file as StoredWeight, widened per encode."""
    return name.endswith(STORED_SUFFIXES)


def vision_tensor_problem(ckpt: Checkpoint, v: VisionConfig) -> str | None:
    """Why the vision weights cannot be loaded (missing or mis-shaped tensors), or None."""
    if v.depth > len(ckpt.tensors):  # before listing the names of 10**12 blocks
        return (
            f"{ckpt.folder}: config.json says the vision encoder has {v.depth} blocks, more "
            "than the weights could hold; the vision config does not match the weights. Use "
            "the config.json that came with these weights to ask about images."
        )
    expected = expected_vision_tensors(v)
    missing = [n for n in expected if n not in ckpt]
    if missing:
        if len(missing) == len(expected):
            return (
                f"{ckpt.folder} has no vision weights (no {PREFIX}* tensors), so this model "
                "cannot look at images. Use a full Qwen3-VL checkpoint to ask about images; "
                "text chat works as it is."
            )
        return (
            f"{ckpt.folder}: {len(missing)} of {len(expected)} vision tensors are missing "
            f"(first: {missing[0]!r}); the weights are incomplete. Download the checkpoint "
            "again to ask about images; text chat works as it is."
        )
    for name, shape in expected.items():
        info = ckpt.info(name)
        if info.shape != shape:
            return (
                f"{info.file}: vision tensor {name!r} has shape {list(info.shape)} but "
                f"config.json implies {list(shape)}; the vision config does not match the "
                "weights. Use the config.json that came with these weights to ask about images."
            )
    return None


@dataclass
class BlockWeights:
    norm1_w: np.ndarray
    norm1_b: np.ndarray
    qkv_w: StoredWeight  # [3VD, VD]
    qkv_b: np.ndarray
    proj_w: StoredWeight  # [VD, VD]
    proj_b: np.ndarray
    norm2_w: np.ndarray
    norm2_b: np.ndarray
    fc1_w: StoredWeight  # [I, VD]
    fc1_b: np.ndarray
    fc2_w: StoredWeight  # [VD, I]
    fc2_b: np.ndarray


@dataclass
class MergerWeights:
    norm_w: np.ndarray  # [VD] (main merger) or [4VD] (DeepStack: after the shuffle)
    norm_b: np.ndarray
    fc1_w: StoredWeight  # [4VD, 4VD]
    fc1_b: np.ndarray
    fc2_w: StoredWeight  # [out, 4VD]
    fc2_b: np.ndarray


@dataclass
class VisionWeights:
    patch_w: np.ndarray  # [VD, C*T*P*P]
    patch_b: np.ndarray
    pos_embed: np.ndarray  # [num_position_embeddings, VD]
    blocks: list[BlockWeights]
    merger: MergerWeights
    deepstack: list[MergerWeights]

    def _all(self) -> list:
        parts = [self.patch_w, self.patch_b, self.pos_embed]
        for b in self.blocks:
            parts += list(vars(b).values())
        for m in [self.merger, *self.deepstack]:
            parts += list(vars(m).values())
        return parts

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (the stored matrices stay in the file)."""
        return sum(a.nbytes for a in self._all() if isinstance(a, np.ndarray))

    @property
    def stored(self) -> list[StoredWeight]:
        return [a for a in self._all() if isinstance(a, StoredWeight)]


def load_vision_weights(ckpt: Checkpoint, v: VisionConfig) -> VisionWeights:
    """Vectors, patch embedding and position table as float32; the block and merger matrices
    as StoredWeight (left in the file). Every shape and dtype is checked against the config."""
    problem = vision_tensor_problem(ckpt, v)
    if problem:
        raise CheckpointError(problem)
    shapes = expected_vision_tensors(v)

    def get(name):
        arr = ckpt.read_f32(PREFIX + name, shapes[PREFIX + name])
        ckpt.release(PREFIX + name)  # the file pages are not needed once converted
        return arr

    files: dict = {}

    def stored(name):
        name = PREFIX + name
        info = ckpt.info(name)
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{info.file}: tensor {name!r} has dtype {info.dtype}, expected BF16, F16 or F32."
            )
        ckpt.check_finite(name)  # NaN/inf refused once, here, with the tensor's name
        path, offset, _ = ckpt.location(name)
        if path not in files:
            files[path] = WeightFile(path)  # read with pread, never mapped (stored.py: SIGBUS)
        return StoredWeight(files[path], offset, info.shape, info.dtype)

    def merger(p):
        return MergerWeights(
            norm_w=get(p + "norm.weight"),
            norm_b=get(p + "norm.bias"),
            fc1_w=stored(p + "linear_fc1.weight"),
            fc1_b=get(p + "linear_fc1.bias"),
            fc2_w=stored(p + "linear_fc2.weight"),
            fc2_b=get(p + "linear_fc2.bias"),
        )

    blocks = []
    for i in range(v.depth):
        p = f"blocks.{i}."
        blocks.append(
            BlockWeights(
                norm1_w=get(p + "norm1.weight"),
                norm1_b=get(p + "norm1.bias"),
                qkv_w=stored(p + "attn.qkv.weight"),
                qkv_b=get(p + "attn.qkv.bias"),
                proj_w=stored(p + "attn.proj.weight"),
                proj_b=get(p + "attn.proj.bias"),
                norm2_w=get(p + "norm2.weight"),
                norm2_b=get(p + "norm2.bias"),
                fc1_w=stored(p + "mlp.linear_fc1.weight"),
                fc1_b=get(p + "mlp.linear_fc1.bias"),
                fc2_w=stored(p + "mlp.linear_fc2.weight"),
                fc2_b=get(p + "mlp.linear_fc2.bias"),
            )
        )
    patch_w = get("patch_embed.proj.weight")
    return VisionWeights(
        patch_w=np.ascontiguousarray(patch_w.reshape(v.hidden_size, -1)),
        patch_b=get("patch_embed.proj.bias"),
        pos_embed=get("pos_embed.weight"),
        blocks=blocks,
        merger=merger("merger."),
        deepstack=[
            merger(f"deepstack_merger_list.{k}.") for k in range(len(v.deepstack_visual_indexes))
        ],
    )
