"""Images encoded while the user types: the composer's attachments -> the engine worker's
ImageJobs, the worker's ImageStatus -> the composer's chips and the performance panel.

Runs on the GUI thread. When an image is attached (drop, paste, the attach button, an edit
that brings a message's images back) an ImageJob goes to the engine thread at once; the
worker prepares the image at its budget, reports "N tokens, about S s to read" (the engine's
cost model for this machine) and encodes it into the model's embedding cache, reporting
blocks done. Send queues the answer behind it on the same thread, so the answer waits only for
what is left of the encode. Removing the image, or changing its detail (which re-encodes it
at the new budget), sets the old job's cancel Event: the encoder stops between blocks.

The budget chosen for each image travels with the message: it is stored with the message's
image (model/store.ImageRef.tokens) and the turns the worker receives carry it
(engine.vision.budget.BudgetedImage), so later turns, after a restart too, render the picture
exactly as it was encoded and the session's cache stays valid.
"""

from __future__ import annotations

import itertools

from PySide6.QtCore import QObject, Signal

from merlin.app.i18n import tr
from merlin.app.model.perf_stats import format_ms
from merlin.app.worker import GENERATION_KEY, ImageJob, ImageStatus
from merlin.engine.vision.budget import preset_tokens
from merlin.engine.vision.preprocess import PreprocessConfig


def status_text(st: ImageStatus, tokens: int) -> str:
    """The chip's line for an image's state."""
    if st.state == "estimate":
        return tr("{n} tokens, about {s} s to read").format(n=st.tokens, s=_secs(st.seconds))
    if st.state == "encoding":
        return tr("{n} tokens, reading {d}/{depth}").format(n=tokens, d=st.done, depth=st.depth)
    if st.state == "done":
        return tr("{n} tokens, read in {s} s").format(n=tokens, s=_secs(st.seconds))
    if st.state == "error":
        return st.message
    return ""


def _secs(s: float) -> str:
    return f"{s:.1f}" if s < 10 else f"{s:.0f}"


class ImageEncoding(QObject):
    """sig_job(object): an ImageJob for the worker (connect it queued to encode_image).
    sig_encoder(str): the performance panel's vision-encoder line."""

    sig_job = Signal(object)
    sig_encoder = Signal(str)

    def __init__(self, composer, options, parent=None):
        """options(): the GenerationOptions of the settings now."""
        super().__init__(parent)
        self.composer = composer
        self.options = options
        self.ready = False  # a model with a vision encoder is loaded
        self._keys = itertools.count(1)
        self._jobs: dict[int, tuple[object, ImageJob]] = {}  # key -> (attachment, job)
        self._tokens: dict[int, int] = {}  # key -> tokens the image became
        self.last: dict[int, ImageStatus] = {}  # key -> latest status (tests, panel)
        pre = PreprocessConfig()
        self._default_presets = {k: preset_tokens(k, pre) for k in ("fast", "detailed", "full")}
        composer.set_presets(self._default_presets)
        composer.sig_attached.connect(self.start)
        composer.sig_detached.connect(self.cancel)
        composer.sig_detail.connect(self.restart)

    # ---- jobs ----------------------------------------------------------------------------

    def _job_of(self, attachment):
        for key, (a, job) in self._jobs.items():
            if a is attachment:
                return key, job
        return None, None

    def start(self, attachment) -> None:
        if not self.ready:
            return  # model_ready() starts it
        key = next(self._keys)
        tokens = self.composer.image_tokens(attachment)
        attached = self.composer.attachments()
        ahead = attached[: next((i for i, a in enumerate(attached) if a is attachment), 0)]
        before = tuple((a.path, self.composer.image_tokens(a)) for a in ahead)
        job = ImageJob(key, attachment.path, tokens, self.options(), before=before)
        self._jobs[key] = (attachment, job)
        self.composer.set_image_status(attachment, tr("waiting to read…"))
        self.sig_job.emit(job)

    def cancel(self, attachment) -> None:
        key, job = self._job_of(attachment)
        if job is not None:
            job.cancel.set()
            del self._jobs[key]

    def restart(self, attachment) -> None:
        self.cancel(attachment)
        self.start(attachment)

    def stop_sent(self) -> None:
        """Stop the encodes of images no longer in the composer (sent with the answer being
        stopped); the answer's own encode stops through its cancel Event."""
        attached = self.composer.attachments()
        for key, (a, job) in list(self._jobs.items()):
            if not any(a is b for b in attached):
                job.cancel.set()
                del self._jobs[key]

    def stop_all(self) -> None:
        """Stop every encode (the window is closing)."""
        for _a, job in self._jobs.values():
            job.cancel.set()
        self._jobs.clear()

    def model_ready(self, vision: bool, presets: dict | None = None) -> None:
        """A model finished loading: its detail presets on the chips (the checkpoint's own
        image limits), and encode what is attached already."""
        # a remote server's model has none of its own: Qwen3-VL's
        self.composer.set_presets(presets or self._default_presets)
        self.ready = bool(vision)
        for key, (_a, job) in list(self._jobs.items()):
            job.cancel.set()
            del self._jobs[key]
        if self.ready:
            for a in self.composer.attachments():
                self.start(a)

    # ---- status from the worker ------------------------------------------------------------

    def on_status(self, st: ImageStatus) -> None:
        self.last[st.key] = st
        if st.key == GENERATION_KEY:
            self._panel(st, 0)
            return
        if st.state == "estimate":
            self._tokens[st.key] = st.tokens
        tokens = self._tokens.get(st.key, 0)
        self._panel(st, tokens)
        entry = self._jobs.get(st.key)
        if entry is None:
            return  # cancelled, or sent and cleared: no chip shows it any more
        text = status_text(st, tokens)
        if text or st.state == "cancelled":
            self.composer.set_image_status(entry[0], text)

    def _panel(self, st: ImageStatus, tokens: int) -> None:
        if st.state == "encoding":
            self.sig_encoder.emit(tr("blocks {d}/{depth}").format(d=st.done, depth=st.depth))
        elif st.state == "done":
            self.sig_encoder.emit(format_ms(st.seconds * 1000))  # as the panel's other times
        elif st.state == "cancelled":
            self.sig_encoder.emit(tr("stopped"))
