"""Chat sessions: a conversation, the KV cache it produced, reused across turns, edits,
regenerations and process restarts, and saved sessions on disk.

One job per module: conversation (messages, images, events), images (image intake and the
embedding cache), fitting (which older turns to leave out, a pure function), persistence (the
session file), store (a size-capped folder of session files), core (Session, which runs a turn
through engine.prompt and engine.generate). Everything a caller needs is importable from here.
"""

from ..prompt import image_hash
from .conversation import ContextTrimmed, Message, SessionImage, common_prefix
from .core import Session, SessionSettings
from .fitting import fit_context
from .images import ImageBank, ImageEmbedding
from .persistence import (
    SESSION_FORMAT,
    SESSION_KIND,
    RestoreResult,
    checkpoint_fingerprint,
    identity_mismatch,
    model_identity,
)
from .store import (
    DEFAULT_STORE_CAP,
    SESSION_SUFFIX,
    STALE_TEMP_SECONDS,
    SaveResult,
    SessionStore,
    StoreUsage,
    default_store_dir,
    format_bytes,
)

__all__ = [
    "DEFAULT_STORE_CAP",
    "SESSION_FORMAT",
    "SESSION_KIND",
    "SESSION_SUFFIX",
    "STALE_TEMP_SECONDS",
    "ContextTrimmed",
    "ImageBank",
    "ImageEmbedding",
    "Message",
    "RestoreResult",
    "SaveResult",
    "Session",
    "SessionImage",
    "SessionSettings",
    "SessionStore",
    "StoreUsage",
    "checkpoint_fingerprint",
    "common_prefix",
    "default_store_dir",
    "fit_context",
    "format_bytes",
    "identity_mismatch",
    "image_hash",
    "model_identity",
]
