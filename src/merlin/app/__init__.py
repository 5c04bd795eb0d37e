"""Merlin's desktop app (PySide6). Never does numerics: it talks to engine/ through its API."""
