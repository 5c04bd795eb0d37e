"""The shipped demo model: a tiny Qwen3-VL trained by the project on pictures of shapes.

It lives in src/merlin/resources/demo-model/ (bf16 safetensors in the real folder layout, a
few MB) and is the default model of `merlin`, `merlin-cli` and the self-test. It answers
questions about pictures drawn by `engine.demo_scenes` (which shapes, colours, how many,
where, which is bigger, a description) in English and Simplified Chinese, and a short honest
sentence to anything else. scripts/train_demo.py (torch + transformers, never a Merlin
dependency) made it; docs/demo-model.md records the recipe, seed, loss curve and wall time.

This module holds what the trainer and Merlin must agree on without torch: the shapes of the
network, the pixel budget, the real Qwen3-VL Instruct chat template, and how the tokenizer
is trained (byte-level BPE on the question/answer text, so every word the demo uses is one or
two tokens and any other input still encodes, byte by byte).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from . import demo_scenes as ds

DEMO_MODEL_NAME = "merlin-demo-shapes"
DEMO_VOCAB = 1024  # embedding rows: BPE + the 26 Qwen special tokens, padded

# Small enough to train in well under an hour on two cores and decode at hundreds of tokens
# per second; the real structure otherwise: GQA 2:1, head_dim 64 with the 2B's interleaved
# MRoPE section ratios, a tied head as the 2B, a ViT whose three DeepStack mergers feed the
# first three decoder layers as the 2B's do.
TEXT = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": DEMO_VOCAB,
    "max_position_embeddings": 8192,
    "rope_theta": 5000000,
    "rope_scaling": {
        "rope_type": "default",
        "mrope_section": [12, 10, 10],
        "mrope_interleaved": True,
    },
}
VISION = {
    "depth": 4,
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_heads": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "out_hidden_size": 256,
    "num_position_embeddings": 256,
    "deepstack_visual_indexes": [0, 1, 2],
}
# 128x128 .. 160x160 pixels: 16 .. 25 image tokens, what the model was trained on.
PREPROCESSOR = {
    "size": {"longest_edge": 25600, "shortest_edge": 16384},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
# Greedy by default: each question has one right answer, and the app, the CLI and the
# evaluation then give the same one.
GENERATION = {"do_sample": False, "repetition_penalty": 1.0}

# `merlin --self-test` asks this about the showcase picture (demo_scenes.SHOWCASE) and compares
# the answer with the one transformers gave on the same checkpoint when it was made, stored in
# the folder: a wrong number anywhere in the engine changes the answer, however well or badly
# the small model knows the picture.
SELF_TEST_QUESTION = "What colour is the circle?"
SELF_TEST_FILE = "self_test.json"


def shipped_dir() -> Path:
    """Where the trained checkpoint ships inside the package."""
    return Path(__file__).resolve().parent.parent / "resources" / "demo-model"


def is_demo_model(folder: Path | str) -> bool:
    """Whether `folder` is the shipped demo model (or a copy of it: its README says so)."""
    readme = Path(folder) / "README.md"
    try:
        return readme.read_text(encoding="utf-8").startswith(f"# {DEMO_MODEL_NAME}")
    except OSError:
        return False


def self_test_reference(folder: Path | str) -> dict:
    """The folder's self-test case: {"question", "answer" (transformers' greedy f32 answer on
    the showcase picture), "truth" (the picture's right answer)}. A demo folder without the
    file (one made before it existed) gets the truth as its expected answer."""
    path = Path(folder) / SELF_TEST_FILE
    truth = ds.answer(ds.SHOWCASE, "colour", "en", "circle")
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        return {
            "question": str(stored["question"]),
            "answer": str(stored["answer"]),
            "truth": str(stored.get("truth", truth)),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {"question": SELF_TEST_QUESTION, "answer": truth, "truth": truth}


def chat_template() -> str:
    """The Qwen3-VL Instruct chat template (tools, system, images/videos, tool responses)."""
    return (Path(__file__).with_name("qwen3vl_instruct_template.jinja")).read_text("utf-8")


def tokenizer_corpus(n_scenes: int = 3000, seed: int = 7) -> list[str]:
    """Lines to train the BPE on: every question wording and answer form, many times over
    (so their words become single tokens), the text-only prompts, and general text."""
    from .demo_tokenizer import DEMO_CORPUS

    rng = random.Random(seed)
    lines = []
    for i in range(n_scenes):
        sc = ds.scene(seed * 10**7 + i)
        for kind in ds.QUESTION_KINDS:
            if ds.can_ask(sc, kind):
                for lang in ds.LANGS:
                    q = ds.question(sc, kind, lang, rng.randrange(10**9))
                    lines += [q.text, q.answer]
    for _ in range(200):
        lines.append(ds.text_only_prompt(rng)[0])
    lines += list(ds.TEXT_ONLY_ANSWER.values()) * 50
    lines += ["user", "assistant", "system", "You are a helpful assistant."] * 50
    lines += DEMO_CORPUS.splitlines()
    return lines


def write_tokenizer(folder: Path) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json, chat_template.json; returns the special ids."""
    from .demo_tokenizer import write_tokenizer_files

    write_tokenizer_files(folder, tokenizer_corpus(), DEMO_VOCAB, chat_template(), split_cjk=True)
    added = json.loads((Path(folder) / "tokenizer_config.json").read_text("utf-8"))
    return {t["content"]: int(i) for i, t in added["added_tokens_decoder"].items()}


def write_side_files(folder: Path) -> dict:
    """Everything but the weights: tokenizer, config.json (4.57 spelling), generation and
    preprocessor configs. Returns the config."""
    from .demo import qwen3vl_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(folder)
    config = qwen3vl_config(TEXT, VISION, ids, tie=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_generation_config(folder, config)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    return config


def write_generation_config(folder: Path, config: dict) -> None:
    """generation_config.json: stop on <|im_end|> / <|endoftext|>, greedy (GENERATION).
    The trainer writes it again after save_pretrained, which replaces it with its own."""
    text = config["text_config"]
    generation = {
        "bos_token_id": text["bos_token_id"],
        "eos_token_id": [text["eos_token_id"], text["bos_token_id"]],
        "pad_token_id": text["bos_token_id"],
        **GENERATION,
    }
    (Path(folder) / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
