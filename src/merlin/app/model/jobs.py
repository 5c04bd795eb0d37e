"""What the GUI and the engine thread send each other: plain dataclasses, no Qt.

Requests (LoadRequest, GenerationJob, SessionJob) go to the engine worker (app/worker.py);
results (ModelInfo, SessionReport, and the engine's own events) come back. Cancellation is a
threading.Event the GUI sets directly, because the worker is busy when it matters.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from merlin.app.model.prompting import GenerationOptions, Turn

# the "map_experts" setting -> engine.model.load_model(map_experts=...): a mixture-of-experts
# model's experts stay memory-mapped from the weight cache always, never, or (auto) only when
# the model would not fit in memory otherwise (docs/moe.md)
MAP_EXPERTS = {"auto": None, "always": True, "never": False}


@dataclass
class LoadRequest:
    source: str  # SOURCE_DEMO, SOURCE_RANDOM_2B or a checkpoint folder
    weights: str = "f32"
    kv: str = "f32"
    warm_up: bool = True  # compile (or load cached) kernels now, not at the first question
    cancel: threading.Event = field(default_factory=threading.Event)
    remote: object | None = None  # model.remote.RemoteConfig: answer with that server instead
    map_experts: bool | None = None  # MAP_EXPERTS' value of the setting (None: auto)
    # the context budget setting (tokens; None: the engine's default): what the memory guard
    # and auto's mapping decision size the KV cache for
    context: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the GUI may know about the loaded model (plain values only)."""

    source: str
    folder: str
    name: str
    description: str
    weights: str
    kv: str
    random_weights: bool  # a random-weight checkpoint (2B-shaped or tiny): random text
    vision: bool
    vision_problem: str
    max_context: int
    weight_bytes_per_token: int
    load_s: float
    mapped_expert_bytes: int = 0  # experts left in the memory-mapped weight cache (0: none)
    demo_model: bool = False  # the shipped demo model, trained on pictures of shapes
    # engine.thinking.support of its chat template: a thinking block? can it be switched off?
    thinking: bool = False
    thinking_switchable: bool = False
    thinking_always: bool = False  # the template opens the block (always thinks)
    thinking_reason: str = ""  # why there is no thinking (engine's words, English)
    # image tokens of each detail preset ("fast", "detailed", "full") for this checkpoint's
    # preprocessing (engine.vision.budget.preset_tokens); empty (a remote model): Qwen3-VL's
    image_presets: dict = field(default_factory=dict)


@dataclass
class GenerationJob:
    job_id: int
    turns: list[Turn]  # the whole conversation, ending with the question
    options: GenerationOptions
    conversation_id: int | None = None  # the key of its saved session (None: not saved)
    cancel: threading.Event = field(default_factory=threading.Event)
    # the names the user knows the turns' pictures by (stored copies have content names)
    image_names: dict[str, str] = field(default_factory=dict)


@dataclass
class SessionJob:
    """Make the worker's session the one of this conversation (None: drop it), restoring
    its saved cache now, while the user reads and types."""

    conversation_id: int | None
    turns: list[Turn]
    options: GenerationOptions


@dataclass(frozen=True)
class SessionReport:
    """What happened to a conversation's saved session (plain values for the GUI)."""

    conversation_id: int
    action: str  # "restored", "not_restored", "saved" or "not_saved"
    reason: str = ""  # why not (empty when it worked)
    tokens: int = 0  # tokens restored or saved
    file_bytes: int = 0

    @property
    def restored(self) -> bool:
        return self.action == "restored"


@dataclass
class ImageJob:
    """Encode an attached image now, while the user types (app/image_encoding.py). key: the
    GUI's name for this attachment and budget; tokens: its image-token budget (None: the
    settings'); before: (path, tokens) of the attachments ahead of it in the composer, for
    the rows computed ahead of the turn. Setting cancel stops the encode between encoder
    blocks."""

    key: int
    path: str
    tokens: int | None
    options: GenerationOptions
    cancel: threading.Event = field(default_factory=threading.Event)
    before: tuple[tuple[str, int | None], ...] = ()


@dataclass(frozen=True)
class ImageStatus:
    """An image's encode (key: ImageJob.key, or GENERATION_KEY for the answer's own encode).
    state: "estimate" (tokens, seconds = predicted), "encoding" (done of depth blocks),
    "done" (seconds = measured), "cancelled" or "error" (message)."""

    key: int
    state: str
    tokens: int = 0
    seconds: float = 0.0
    done: int = 0
    depth: int = 0
    message: str = ""


GENERATION_KEY = -1
