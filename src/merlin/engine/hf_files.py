"""Reading a checkpoint's text and JSON files (tokenizer.json, tokenizer_config.json, chat
templates) with errors that name the file and say what to do."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import TokenizerError

MAX_FILE_BYTES = 256 << 20  # tokenizer.json of Qwen3-VL: 11 MB


def _read_text(path: Path) -> str:
    from .safe_open import read_text

    try:
        # a FIFO or device is refused with what it is; never opened blocking
        return read_text(path, path.name, TokenizerError, MAX_FILE_BYTES)
    except UnicodeDecodeError as e:
        raise TokenizerError(
            f"{path} is not valid UTF-8 text ({e.reason} at byte {e.start}). "
            "Replace it with the original file from the model download."
        ) from e
    except OSError as e:
        raise TokenizerError(
            f"Cannot read {path}: {e.strerror or e}. Check that the file exists and is readable."
        ) from e


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(
            f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}). "
            "The file is probably truncated or edited; replace it with the original file from "
            "the model download."
        ) from e
    except (ValueError, RecursionError) as e:  # a 5000-digit number; `[[[[...` too deep
        raise TokenizerError(
            f"{path} is not valid JSON ({e}). Replace it with the original file from the model "
            "download."
        ) from None


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes a token as "text" or as {"content": "text", ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None
