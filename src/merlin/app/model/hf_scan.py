"""Find the checkpoints Merlin runs in the Hugging Face cache, so the model dialog can offer
them.

Qt-free. Looks at `$HF_HUB_CACHE`, `$HF_HOME/hub` and `~/.cache/huggingface/hub` for
`models--*/snapshots/*/config.json` whose model type is one the engine loads
(engine.config.SUPPORTED_MODEL_TYPES: Qwen3-VL, Qwen3-VL-MoE, the text-only Qwen3-MoE), or
whose architecture names one of those.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from merlin.engine.config import SUPPORTED_MODEL_TYPES

MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class FoundCheckpoint:
    name: str  # e.g. "Qwen/Qwen3-VL-2B-Instruct"
    path: Path
    complete: bool  # weights and tokenizer files are present


def hf_cache_dirs() -> list[Path]:
    dirs = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            dirs.append(Path(os.path.expanduser(os.environ[var])))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(os.path.expanduser(xdg)) if xdg else Path.home() / ".cache"
    dirs.append(base / "huggingface" / "hub")
    seen, out = set(), []
    for d in dirs:
        key = str(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


ARCHITECTURES = ("Qwen3VL", "Qwen3Moe")  # Qwen3VLForConditionalGeneration, Qwen3VLMoe..., ...


def is_supported_folder(folder: Path) -> bool:
    config = folder / "config.json"
    try:
        if not config.is_file() or config.stat().st_size > MAX_CONFIG_BYTES:
            return False
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(raw, dict):
        return False
    archs = raw.get("architectures") or []
    model_type = str(raw.get("model_type", ""))
    return model_type in SUPPORTED_MODEL_TYPES or any(
        isinstance(a, str) and a.startswith(ARCHITECTURES) for a in archs
    )


def _complete(folder: Path) -> bool:
    has_weights = (folder / "model.safetensors").exists() or (
        folder / "model.safetensors.index.json"
    ).exists()
    return has_weights and (folder / "tokenizer.json").exists()


def find_checkpoints(roots: list[Path] | None = None) -> list[FoundCheckpoint]:
    found = []
    for root in roots if roots is not None else hf_cache_dirs():
        try:
            repos = sorted(root.glob("models--*"))
        except OSError:
            continue
        for repo in repos:
            name = repo.name[len("models--") :].replace("--", "/")
            snapshots = sorted(
                (s for s in (repo / "snapshots").glob("*") if s.is_dir()),
                key=lambda s: s.stat().st_mtime,
                reverse=True,
            )
            for snap in snapshots:
                if is_supported_folder(snap):
                    found.append(FoundCheckpoint(name, snap, _complete(snap)))
                    break  # the newest snapshot of each repo
    return found
