"""System-prompt presets: a few shipped with Merlin, and the user's own, kept in
`presets.json` in the data folder. Qt-free.

The user's file is a JSON object {"version": 1, "presets": {"name": "prompt", ...}}, written
atomically. A file that cannot be read (damaged, not ours, a newer version) is never written
over: the shipped presets are still offered, and saving says why it cannot.
"""

from __future__ import annotations

import json
from pathlib import Path

from merlin.app.model.chat_export import write_atomically
from merlin.engine.tokenizer import clean_text

FILE = "presets.json"
VERSION = 1
MAX_NAME = 80
MAX_PROMPT = 20_000
MAX_PRESETS = 200

# name -> prompt; names are shown translated by the settings dialog (N_ marks them there)
SHIPPED = {
    "Default": "",
    "Concise": "Answer briefly and directly. Use short sentences; no preamble.",
    "Describe pictures in detail": (
        "When the user shows a picture, describe what is in it first: objects, people, text, "
        "colours and where things are. Then answer the question."
    ),
    "Step by step": "Think through the problem step by step, then give the answer on its own line.",
    "Answer in Chinese": "请始终用简体中文回答。",
}


class PresetError(ValueError):
    """A preset could not be saved; the message is for the user."""


class Presets:
    def __init__(self, folder: Path):
        self.path = Path(folder) / FILE
        self.user: dict[str, str] = {}
        self.problem = ""  # why the user's file could not be read ("" when it could)
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            if not self.path.is_file() or self.path.stat().st_size > 4 << 20:
                raise ValueError("not a regular file of presets")
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError("not a version-1 presets file")
            presets = doc.get("presets")
            if not isinstance(presets, dict):
                raise ValueError("'presets' is not an object")
            self.user = {  # lone surrogates (JSON escapes) as U+FFFD: saving encodes UTF-8
                clean_text(str(k)[:MAX_NAME]): clean_text(v[:MAX_PROMPT])
                for k, v in list(presets.items())[:MAX_PRESETS]
                if isinstance(v, str) and str(k).strip()
            }
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
            self.user = {}
            self.problem = f"{self.path} could not be read ({e}); it is left as it is."

    def names(self) -> list[str]:
        """Shipped first, then the user's own (a user's preset may reuse a shipped name)."""
        return list(SHIPPED) + [n for n in self.user if n not in SHIPPED]

    def prompt(self, name: str) -> str:
        return self.user.get(name, SHIPPED.get(name, ""))

    def is_user(self, name: str) -> bool:
        return name in self.user

    def save(self, name: str, prompt: str) -> None:
        name = name.strip()
        if not name:
            raise PresetError("A preset needs a name.")
        if len(name) > MAX_NAME or len(prompt) > MAX_PROMPT:
            raise PresetError(
                f"A preset's name holds up to {MAX_NAME} characters and its prompt up to "
                f"{MAX_PROMPT:,}."
            )
        if name not in self.user and len(self.user) >= MAX_PRESETS:
            raise PresetError(f"There are already {MAX_PRESETS} presets; delete one first.")
        self._write({**self.user, clean_text(name): clean_text(prompt)})

    def delete(self, name: str) -> None:
        if name in self.user:
            self._write({k: v for k, v in self.user.items() if k != name})

    def _write(self, user: dict[str, str]) -> None:
        if self.problem:
            raise PresetError(self.problem)
        data = json.dumps({"version": VERSION, "presets": user}, ensure_ascii=False, indent=1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, data.encode("utf-8"))
        except OSError as e:
            raise PresetError(f"{self.path} could not be written ({e.strerror or e}).") from None
        self.user = user
