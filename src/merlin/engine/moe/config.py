"""The mixture-of-experts keys of a config.json, validated.

Both architectures spell them alike (text_config of qwen3_vl_moe, the top level of
qwen3_moe): num_experts (transformers 5.x also writes its alias num_local_experts),
num_experts_per_tok, moe_intermediate_size, norm_topk_prob, decoder_sparse_step and
mlp_only_layers. Layer i is routed when it is not in mlp_only_layers and
(i + 1) % decoder_sparse_step == 0 (transformers' Qwen3MoeDecoderLayer); the other layers
keep the dense MLP of intermediate_size.

norm_topk_prob: Qwen3MoE renormalises the top-k probabilities only when it is true (default
false); transformers' Qwen3VLMoeTextTopKRouter always renormalises (its config has no such
key), so for qwen3_vl_moe it is true whatever the file says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

MOE_MODEL_TYPES = ("qwen3_vl_moe", "qwen3_moe")
# Expert counts drive loops over tensor names before any tensor is read; the published
# models have 128, so anything above this is a damaged config.
MAX_EXPERTS = 4096


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]

    def is_moe_layer(self, i: int) -> bool:
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0


def _int(d: dict, key: str, where: str, path: Path, default=None) -> int:
    value = d.get(key, default)
    if value is None:
        raise CheckpointError(f"{path}: '{where}{key}' is missing. Is this a Qwen3 MoE checkpoint?")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{path}: '{where}{key}' must be a positive integer, got {value!r}.")
    return value


def parse_moe(
    text: dict, model_type: str, n_layers: int, where: str, path: Path
) -> MoEConfig | None:
    """The MoE settings of a text config (None for a dense model type)."""
    if model_type not in MOE_MODEL_TYPES:
        return None
    key = "num_experts" if "num_experts" in text else "num_local_experts"
    experts = _int(text, key, where, path)
    if experts > MAX_EXPERTS:
        raise CheckpointError(
            f"{path}: '{where}{key}' is {experts}; no Qwen3 MoE model has more than "
            f"{MAX_EXPERTS}. The config is damaged."
        )
    k = _int(text, "num_experts_per_tok", where, path)
    if k > experts:
        raise CheckpointError(
            f"{path}: '{where}num_experts_per_tok' ({k}) is larger than '{where}{key}' "
            f"({experts}): a token cannot be routed to more experts than the layer has."
        )
    step = _int(text, "decoder_sparse_step", where, path, 1)
    only = text.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers for i in only
    ):
        raise CheckpointError(
            f"{path}: '{where}mlp_only_layers' must list layer indexes below {n_layers}, "
            f"got {only!r}."
        )
    norm = text.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise CheckpointError(f"{path}: '{where}norm_topk_prob' must be true or false.")
    if model_type == "qwen3_vl_moe":
        norm = True  # transformers' Qwen3VLMoeTextTopKRouter always renormalises
    return MoEConfig(
        num_experts=experts,
        experts_per_token=k,
        moe_intermediate_size=_int(text, "moe_intermediate_size", where, path),
        norm_topk_prob=norm,
        decoder_sparse_step=step,
        mlp_only_layers=tuple(sorted(set(only))),
    )
