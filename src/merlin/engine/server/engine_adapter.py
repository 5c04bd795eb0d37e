"""The server's one door to the engine: a small pool of engine sessions (engine.session).

Every request carries the whole conversation. The adapter gives it to the session whose last
conversation shares the longest prefix with it (same system prompt, then the same messages),
and that session's `respond()` reuses the KV rows of the common prefix and the embeddings of
images it has already encoded (keyed by pixel content). So a client that sends its chat again
with one more question prefills only the new turn, as the app does. A conversation that matches
none takes a fresh session while the pool has room, else the least recently used one.

Only the public Session API is used here (Session, SessionSettings, Message, `image()`,
`set_system()`, `respond()`), and only from the generation thread (engine.server.queue): the
sessions are not thread-safe and the engine runs one generation at a time anyway.

The events are the engine's own (PrefillDone, Tokens, Finished; a ContextTrimmed is dropped:
its notice is in Finished). Three things are added on the way: `stop` strings (the text is
cut before the first stop string, held back while it could still be one, and the generation
is cancelled at its next step), the step-profile totals in Finished.totals["profile"], and a
notice for messages an earlier request on the session already left out (each request stands
alone: its client is told what the model did not see).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ..errors import InputError, MerlinError
from ..generate import Finished, PrefillDone, Tokens
from ..profile import StepProfile
from ..session import ContextTrimmed, Message, Session, SessionSettings
from .errors import ApiError
from .images import ImageResolver
from .schema import ChatRequest


class StopFilter:
    """Cuts a stream of text before the first occurrence of any stop string: at the earliest
    position where one starts in the whole text, whatever the chunks. A match found in what
    arrived is held back while a longer stop string that starts before it may still complete
    (stops "b" and "cba", chunks "cb" + "a": the cut is at 0, not after "c")."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        cut, start = self._first_match(), self._first_partial()
        if cut >= 0 and (start is None or cut <= start):
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        keep_from = len(self.pending) if start is None else start
        out, self.pending = self.pending[:keep_from], self.pending[keep_from:]
        return out

    def flush(self) -> str:
        """The rest at the end of the stream: no stop string can complete any more."""
        if self.stopped:
            self.pending = ""
            return ""
        cut = self._first_match()
        out = self.pending if cut < 0 else self.pending[:cut]
        self.stopped, self.pending = cut >= 0, ""
        return out

    def _first_match(self) -> int:
        found = (i for i in (self.pending.find(s) for s in self.stops) if i >= 0)
        return min(found, default=-1)

    def _first_partial(self) -> int | None:
        """The first position from which the rest of `pending` begins a longer stop string."""
        n = len(self.pending)
        for j in range(max(0, n - self.hold), n):
            tail = self.pending[j:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self.stops):
                return j
        return None


@dataclass
class _Slot:
    session: Session
    keys: list = field(default_factory=list)  # its last conversation, as message keys
    used: float = 0.0


def _common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


PROFILE_KEYS = ("gemm_ms", "attn_ms", "other_ms", "total_ms", "weight_bytes", "kv_bytes")


class EngineAdapter:
    def __init__(
        self,
        model,
        *,
        context_budget: int = 8192,
        sessions: int = 2,
        max_pixels: int | None = None,
        spec: str = "auto",
        spec_k: int = 4,
    ):
        self.model = model
        self.context_budget = max(
            1, min(int(context_budget or model.max_context), model.max_context)
        )
        self.max_sessions = max(1, int(sessions))
        self.max_pixels = max_pixels
        self.spec, self.spec_k = spec, spec_k
        self._pool: list[_Slot] = []
        self.counts = {"answered": 0, "cancelled": 0, "failed": 0}  # for /health

    def _settings(self) -> SessionSettings:
        return SessionSettings(context_budget=self.context_budget, max_pixels=self.max_pixels)

    def _pick(self, keys: list) -> _Slot:
        best = max(self._pool, key=lambda s: (_common(s.keys, keys), s.used), default=None)
        if best is not None and _common(best.keys, keys) >= 2:  # system and a first message
            return best
        if len(self._pool) < self.max_sessions:
            slot = _Slot(Session(self.model, settings=self._settings()))
            self._pool.append(slot)
            return slot
        return min(self._pool, key=lambda s: s.used)

    def _image(self, session: Session, path, ref, resolver: ImageResolver):
        try:
            return session.image(str(path))
        except InputError as e:
            msg = str(e).replace(str(path), resolver.describe(path))
            raise ApiError(f"'{ref.param}': {msg}", ref.param) from None

    def start(self, req: ChatRequest, resolver: ImageResolver, cancel: threading.Event) -> Iterator:
        """The events of the answer to `req` (checks happen now: ApiError naming the field).
        Call from the generation thread only."""
        t0 = time.perf_counter()
        paths = [[resolver.resolve(r.url, r.param) for r in m.images] for m in req.messages]
        keys = [("system", req.system)] + [
            (m.role, m.text, tuple(str(p) for p in ps), m.image_offsets)
            for m, ps in zip(req.messages, paths)
        ]
        slot = self._pick(keys)
        session = slot.session
        slot.keys, slot.used = [], time.monotonic()  # until this answer ends well
        messages = [
            Message(
                m.role,
                m.text,
                [self._image(session, p, r, resolver) for p, r in zip(ps, m.images)],
                reasoning=m.reasoning,
                image_offsets=m.image_offsets or None,
            )
            for m, ps in zip(req.messages, paths)
        ]
        try:
            sampling = replace(self.model.defaults.sampling, **req.sampling).validate()
        except InputError as e:
            raise ApiError(str(e), next(iter(req.sampling), None)) from None
        session.set_system(req.system)
        try:
            events = session.respond(
                messages,
                sampling=sampling,
                max_new_tokens=req.max_tokens or self.context_budget,
                ignore_eos=req.ignore_eos,
                spec=self.spec,
                spec_k=self.spec_k,
                cancel=cancel,
            )
        except InputError as e:
            msg = str(e)
            code = "context_length_exceeded" if "context budget" in msg else None
            raise ApiError(msg, "messages", code=code) from None
        return self._events(events, req, slot, keys, cancel, t0)

    def _events(self, events, req, slot: _Slot, keys, cancel, t0: float) -> Iterator:
        stops = StopFilter(req.stop)
        profile = dict.fromkeys(PROFILE_KEYS, 0.0)
        steps = 0
        first = last = None  # when the first and the last text left the engine
        trimmed_now = False  # this request left messages out (its notice is in Finished)
        try:
            for ev in events:
                if isinstance(ev, ContextTrimmed):
                    trimmed_now = True
                elif isinstance(ev, PrefillDone):
                    yield ev
                elif isinstance(ev, Tokens):
                    if ev.ids:
                        steps += 1
                        for k in PROFILE_KEYS:
                            profile[k] += getattr(ev.profile, k)
                    text = stops.push(ev.text)
                    if stops.stopped:
                        cancel.set()
                    if text:
                        last = time.perf_counter()
                        first = first or last
                    if text or ev.reasoning:  # a thinking model's reasoning goes on apart
                        yield Tokens(text, ev.ids, ev.profile, ev.reasoning, ev.reasoning_ids)
                elif isinstance(ev, Finished):
                    tail = stops.flush()
                    if tail:
                        yield Tokens(tail, [], StepProfile())
                    totals = dict(ev.totals)
                    # the engine side of what a client measures (engine.bench.serve pairs
                    # them): start() to the first text, text tokens/s after the first
                    n = totals.get("generated_tokens", 0)
                    if first is not None:
                        totals["engine_ttft_ms"] = round((first - t0) * 1e3, 3)
                        span = last - first
                        totals["engine_tokens_per_s"] = round((n - 1) / span, 3) if span else 0.0
                    totals["profile"] = {
                        "steps": steps,
                        **{k: round(v, 3) for k, v in profile.items() if k.endswith("_ms")},
                        **{k: int(v) for k, v in profile.items() if k.endswith("_bytes")},
                    }
                    dropped = totals.get("dropped_messages") or []
                    notices = list(totals.get("notices") or [])
                    if dropped and not trimmed_now:  # left out by an earlier request on this
                        notices.append(  # session: each request reports its own trimming
                            "The conversation does not fit in the context budget of "
                            f"{slot.session.budget} tokens: the {len(dropped)} oldest "
                            "message(s) were left out of what the model sees."
                        )
                        totals["notices"] = notices
                    reason = "stop_string" if stops.stopped else ev.reason
                    self.counts["cancelled" if reason == "cancelled" else "answered"] += 1
                    slot.keys = keys + [("assistant", totals.get("text", ""), ())]
                    yield Finished.of(reason, totals)
        except InputError as e:
            self.counts["failed"] += 1
            raise ApiError(str(e), "messages") from None
        except MerlinError as e:
            self.counts["failed"] += 1
            raise ApiError(str(e), None, status=500) from None
