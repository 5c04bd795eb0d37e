"""The checkpoints the Get-a-model dialog offers: Qwen3-VL 2B / 4B / 8B, Instruct and Thinking.

Qt-free. Each entry carries the shapes of its config.json (the published values; Instruct and
Thinking share them), so that the download size and the memory each weights format needs are
computed by the engine's own estimator (merlin.engine.memory), the same one that guards a load,
before anything is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from merlin.engine.config import parse_config
from merlin.engine.memory import DEFAULT_CONTEXT, estimate_for


@dataclass(frozen=True)
class Shapes:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    tied: bool
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    deepstack: tuple[int, int, int]


SHAPES = {
    "2B": Shapes(2048, 28, 6144, 16, 8, True, 24, 1024, 4096, (5, 11, 17)),
    "4B": Shapes(2560, 36, 9728, 32, 8, True, 24, 1024, 4096, (5, 11, 17)),
    "8B": Shapes(4096, 36, 12288, 32, 8, False, 27, 1152, 4304, (8, 16, 24)),
}
VOCAB = 151_936
IMAGE_PIXELS = 1024 * 32 * 32  # a 1024-token picture (the desktop default budget)


@dataclass(frozen=True)
class Entry:
    repo_id: str  # on the Hugging Face hub; ModelScope uses the same id
    size: str  # "2B", "4B", "8B"
    thinking: bool

    @property
    def name(self) -> str:
        return self.repo_id.split("/", 1)[1]

    @property
    def shapes(self) -> Shapes:
        return SHAPES[self.size]

    def config(self) -> dict:
        """A config.json with this model's shapes (enough for the memory estimate)."""
        s = self.shapes
        return {
            "model_type": "qwen3_vl",
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "tie_word_embeddings": s.tied,
            "text_config": {
                "model_type": "qwen3_vl_text",
                "hidden_size": s.hidden,
                "num_hidden_layers": s.layers,
                "intermediate_size": s.intermediate,
                "num_attention_heads": s.heads,
                "num_key_value_heads": s.kv_heads,
                "head_dim": 128,
                "vocab_size": VOCAB,
                "max_position_embeddings": 262144,
                "rope_theta": 5_000_000,
                "rope_scaling": {
                    "rope_type": "default",
                    "mrope_section": [24, 20, 20],
                    "mrope_interleaved": True,
                },
                "rms_norm_eps": 1e-6,
                "hidden_act": "silu",
                "tie_word_embeddings": s.tied,
            },
            "vision_config": {
                "depth": s.vision_depth,
                "hidden_size": s.vision_hidden,
                "intermediate_size": s.vision_intermediate,
                "num_heads": 16,
                "patch_size": 16,
                "temporal_patch_size": 2,
                "spatial_merge_size": 2,
                "in_channels": 3,
                "out_hidden_size": s.hidden,
                "num_position_embeddings": 2304,
                "deepstack_visual_indexes": list(s.deepstack),
                "hidden_act": "gelu_pytorch_tanh",
            },
        }

    def parameters(self) -> int:
        """Parameter count of the checkpoint (text + vision), from the shapes."""
        s = self.shapes
        d, f, hd = s.hidden, s.intermediate, 128
        attn = d * s.heads * hd * 2 + d * s.kv_heads * hd * 2 + 2 * hd
        layer = attn + 3 * d * f + 2 * d
        text = s.layers * layer + VOCAB * d * (1 if s.tied else 2) + d
        vd, vf = s.vision_hidden, s.vision_intermediate
        block = 4 * vd * vd + 4 * vd + 2 * vd * vf + vf + vd + 4 * vd
        merged = 4 * vd  # 2x2 patches merged
        mlp = merged * merged + merged + merged * d + d
        merger = 2 * vd + mlp  # LayerNorm before the shuffle
        deepstack = 2 * merged + mlp  # LayerNorm after it
        vision = (
            s.vision_depth * block
            + 3 * 16 * 16 * 2 * vd
            + vd
            + 2304 * vd
            + merger
            + deepstack * len(s.deepstack)
        )
        return text + vision

    def download_bytes(self) -> int:
        return 2 * self.parameters()  # bf16 safetensors (the tokenizer and configs are small)

    def memory_bytes(self, weights: str, kv: str = "q8", context: int = DEFAULT_CONTEXT) -> int:
        """What loading it needs with `weights`, a `kv` cache of `context` tokens and a
        1024-token picture: the engine's memory estimate."""
        cfg = parse_config(self.config(), Path(f"<{self.name}>/config.json"))
        est = estimate_for(cfg, Path("."), weights, kv, context, IMAGE_PIXELS)
        return est.total


CATALOGUE = tuple(
    Entry(f"Qwen/Qwen3-VL-{size}-{kind}", size, kind == "Thinking")
    for size in ("2B", "4B", "8B")
    for kind in ("Instruct", "Thinking")
)
