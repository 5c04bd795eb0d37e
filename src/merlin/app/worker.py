"""The engine in a QThread: loads models and runs generations off the GUI thread.

The worker owns the loaded Model and one engine Session: the conversation shown, with its KV
cache and image embeddings, so a follow-up, a regenerate or an edit prefills only what changed.
The session is saved (engine.session.SessionStore, a size-capped folder) when a turn ends and
restored when the conversation is opened again; the chat store stays the truth for the text,
a saved session is only a cache. The GUI never touches the model or the session. Requests
arrive by queued signals (plain dataclasses), results leave by signals carrying plain engine
events. Cancellation uses threading.Events the GUI sets directly, because the worker is busy
when it matters.
"""

from __future__ import annotations

import logging
import threading
import traceback
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from merlin.app import pyside_fixes
from merlin.app.i18n import tr
from merlin.app.model import downloads
from merlin.app.model.history import missing_images_notice, without_refused_images
from merlin.app.model.jobs import (  # noqa: F401 (the worker's requests and results)
    GENERATION_KEY,
    GenerationJob,
    ImageJob,
    ImageStatus,
    LoadRequest,
    ModelInfo,
    SessionJob,
    SessionReport,
)
from merlin.app.model.prompting import (
    GenerationOptions,
    Turn,
    answer_options,
    session_messages,
    session_settings,
)
from merlin.engine import warmup
from merlin.engine.errors import CheckpointError, MerlinError, ResourceError
from merlin.engine.session import DEFAULT_STORE_CAP, Session, SessionStore

pyside_fixes.install()
log = logging.getLogger(__name__)

SOURCE_DEMO = "demo"
SOURCE_RANDOM_2B = "random-2b"


class _LoadCancelled(Exception):
    pass


def describe_source(source: str) -> str:
    if source == SOURCE_DEMO:
        return "Merlin demo (shapes)"
    if source == SOURCE_RANDOM_2B:
        return "Qwen3-VL-2B shapes (random weights)"
    return source.rstrip("/").split("/")[-1] or source


class EngineWorker(QObject):
    """Lives in the engine thread.

    sig_load_progress(float, str): loading progress 0..1 and the phase.
    sig_loaded(object): a ModelInfo; the new model is in use.
    sig_load_failed(str): loading failed (the previous model, if any, stays in use).
    sig_load_cancelled(): the user cancelled loading (the previous model stays in use).
    sig_event(int, object): job id, one engine event (PrefillDone, Tokens, Finished).
    sig_failed(int, str): job id, why the generation failed (a message for the user).
    sig_job_done(int): job id; the worker is free again.
    sig_session(object): a SessionReport (a saved session was restored or not, saved or not).
    sig_image(object): an ImageStatus (an image encoded on attach, or during an answer).
    sig_count(object): a CountReport (the context meter: app/model/counting.py).
    """

    sig_load_progress = Signal(float, str)
    sig_loaded = Signal(object)
    sig_load_failed = Signal(str)
    sig_load_cancelled = Signal()
    sig_event = Signal(int, object)
    sig_failed = Signal(int, str)
    sig_job_done = Signal(int)
    sig_session = Signal(object)
    sig_image = Signal(object)
    sig_count = Signal(object)

    def __init__(
        self, sessions_folder: Path | str | None = None, cap_bytes: int = DEFAULT_STORE_CAP
    ):
        """sessions_folder: where conversations' sessions are saved (None: never saved)."""
        super().__init__()
        self._model = None
        self._remote = None  # model.remote.RemoteBackend while a remote server is in use
        self._session: Session | None = None
        self._session_key: int | None = None
        self._store = SessionStore(sessions_folder, cap_bytes) if sessions_folder else None
        # held while this worker computes; the API server the app may run (app/serving.py)
        # holds it for each request it answers, so the two never compute at once
        self.engine_lock = threading.Lock()

    @property
    def model(self):
        """The local model in use (None before a load, or while a remote server answers)."""
        return None if self._remote is not None else self._model

    def _engine_turn(self, cancel: threading.Event) -> bool:
        """Take the engine lock, waiting while a served request computes; False if the
        user cancelled meanwhile."""
        while not self.engine_lock.acquire(timeout=0.1):
            if cancel.is_set():
                return False
        return True

    # ---- loading -------------------------------------------------------------------------

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        from merlin.engine.model import load_model

        def progress(fraction: float, phase: str) -> None:
            if request.cancel.is_set():
                raise _LoadCancelled
            self.sig_load_progress.emit(float(fraction), phase)

        self._drop_session()  # it was saved when its turn ended; free its KV cache now
        if request.remote is not None:  # an OpenAI-compatible server (app/remote_worker.py)
            from merlin.app.remote_worker import connect

            connect(self, request)
            return
        try:
            progress(0.0, "finding the checkpoint")
            folder = self._resolve(request.source, progress)
            base = 0.02
            if request.warm_up and not warmup.is_warm(request.weights, request.kv):
                # compile first, in a child (engine.warmup): compiling holds the GIL and
                # would freeze the window; loading quantizes with the same kernels
                base = 0.4
                warmup.warm_up_in_child(
                    request.weights,
                    request.kv,
                    lambda f, phase: progress(
                        0.01 + 0.39 * f, f"compiling kernels (first start only): {phase}"
                    ),
                    request.cancel,
                )
            model = load_model(
                folder,
                weights=request.weights,
                kv=request.kv,
                progress=lambda f, phase: progress(base + (0.9 - base) * f, phase),
                map_experts=request.map_experts,
                context=request.context,
            )
            if request.warm_up:
                self._warm_up(model, progress)
            progress(1.0, "ready")
        except (_LoadCancelled, warmup.WarmupCancelled):
            self.sig_load_cancelled.emit()
            return
        except ResourceError as e:
            self.sig_load_failed.emit(f"not enough memory. {e}")
            return
        except MerlinError as e:
            self.sig_load_failed.emit(str(e))
            return
        except MemoryError:
            self.sig_load_failed.emit(
                "not enough memory for this model. Choose q8 or q4 weights, or a smaller model."
            )
            return
        except Exception as e:  # an engine bug: report it, keep the app alive
            traceback.print_exc()
            self.sig_load_failed.emit(f"loading failed unexpectedly ({type(e).__name__}: {e}).")
            return
        self._model, self._remote = model, None
        vision = model.vision
        self.sig_loaded.emit(
            ModelInfo(
                source=request.source,
                folder=str(model.folder),
                name=describe_source(request.source),
                description=model.config.describe(),
                weights=model.weights_fmt,
                kv=model.kv_fmt,
                random_weights=request.source == SOURCE_RANDOM_2B
                or _is_random_checkpoint(model.folder),
                vision=bool(vision and vision.available),
                vision_problem=(vision.problem or "") if vision else "",
                max_context=model.max_context,
                weight_bytes_per_token=model.bytes_per_token,
                load_s=model.load_s,
                mapped_expert_bytes=model.memory.mapped_experts
                if model.experts_mapped and model.memory
                else 0,
                demo_model=_is_demo_model(model.folder),
                image_presets=_image_presets(vision),
                **thinking_info(model.tokenizer),
            )
        )

    @staticmethod
    def _resolve(source: str, progress) -> str:
        from merlin.engine import demo

        if source == SOURCE_DEMO or not source:
            return str(demo.ensure_demo_checkpoint())
        if source == SOURCE_RANDOM_2B:
            folder = demo.random_checkpoint_dir(demo.QWEN3VL_2B)
            if not (folder / "model.safetensors").is_file():
                progress(0.01, "building the 2B-shaped random checkpoint (first time only)")
            return str(demo.ensure_random_checkpoint(demo.QWEN3VL_2B))
        if downloads.is_incomplete(Path(source)):  # a load would blame the checkpoint
            raise CheckpointError(
                f"The download into {source} is not finished; open Get a model… to resume it."
            )
        return source

    @staticmethod
    def _warm_up(model, progress) -> None:
        """Run every kernel once so Numba compiles them (or loads its disk cache) now."""
        from merlin.engine.generate import AnswerOptions, generate
        from merlin.engine.prompt import build_prompt, text_prompt
        from merlin.engine.sampling import SamplingParams

        progress(0.94, "compiling kernels (first start only)")
        ids = model.tokenizer.encode_text("Hello")
        greedy = AnswerOptions(
            SamplingParams(temperature=0.0), max_new_tokens=2, ignore_eos=True, spec="off"
        )
        for _ in generate(model, text_prompt(ids), greedy, max_context=64):
            pass
        if model.vision is not None and model.vision.available:
            # an image prompt and two decode steps after it (3D positions, rope delta)
            progress(0.96, "compiling the vision kernels (first start only)")
            from PIL import Image

            from merlin.engine.vision import prepare_pil

            cfg = model.vision.preprocess.with_max_pixels(model.vision.preprocess.factor**2 * 4)
            image = prepare_pil(Image.new("RGB", (64, 64), (128, 128, 128)), cfg, "warm-up")
            prompt = build_prompt(model.tokenizer, model.config, "Hi", [image])
            for _ in generate(model, prompt, greedy, max_context=len(prompt.ids) + 8):
                pass

    # ---- sessions ------------------------------------------------------------------------

    def _drop_session(self) -> None:
        self._session, self._session_key = None, None

    def _session_for(self, key: int | None, turns: list[Turn], options: GenerationOptions):
        """The session of conversation `key` with these settings: the one in memory, or a new
        one whose cache is restored from its saved file when that file fits this model."""
        s = self._session
        # a new chat's first turn adopts the session its attached images started (key None,
        # no messages: only rows computed ahead, encode_image)
        if s is not None and self._session_key is None and not s.messages and len(turns) <= 1:
            self._session_key = key
        if s is not None and s.model is self._model and self._session_key == key:
            s.set_system(options.system_prompt)
            s.settings.max_pixels = options.max_pixels or None
            s.settings.image_tokens = options.image_tokens or None
            if s.settings.context_budget != max(0, int(options.context_budget)):
                s.set_context_budget(max(0, int(options.context_budget)))
            return s
        self._drop_session()
        s = Session(self._model, options.system_prompt, session_settings(options))
        if key is not None and self._store is not None:
            # the messages first: the restore then keeps which old turns were left out
            s.set_messages(session_messages(turns))
            r = self._store.restore(s, str(key))
            action = "restored" if r.restored else "not_restored"
            self.sig_session.emit(SessionReport(key, action, r.reason, r.tokens, r.file_bytes))
        self._session, self._session_key = s, key
        return s

    def _save_session(self) -> None:
        s, key = self._session, self._session_key
        if s is None or key is None or self._store is None or self._store.cap_bytes <= 0:
            return
        try:
            r = self._store.save(s, str(key))
        except Exception as e:  # the chat is in the store; a lost cache only costs time
            log.warning("the session of chat %s was not saved: %s", key, e)
            return
        action = "saved" if r.saved else "not_saved"
        self.sig_session.emit(
            SessionReport(key, action, r.reason, s.cached_tokens if r.saved else 0, r.file_bytes)
        )

    @Slot(object)
    def prepare(self, job: SessionJob) -> None:
        """The conversation shown changed (or a model loaded): switch sessions now."""
        if self._model is None:
            return
        if job.conversation_id is None:
            self._drop_session()
            return
        try:
            turns, _ = without_refused_images(job.turns)
            self._session_for(job.conversation_id, turns, job.options)
        except MerlinError as e:  # e.g. an image file is gone: the next turn says so
            log.info("chat %s: session not prepared: %s", job.conversation_id, e)
            self._drop_session()
        except Exception:
            traceback.print_exc()
            self._drop_session()

    @Slot(object)
    def forget(self, conversation_id: int) -> None:
        """The conversation was deleted: its session goes too (in memory and on disk)."""
        if self._session_key == conversation_id:
            self._drop_session()
        if self._store is not None:
            self._store.delete(str(conversation_id))

    @Slot(object)
    def set_session_cap(self, cap_bytes: int) -> None:
        """A new disk limit for saved sessions (0: none are kept); evicts at once."""
        if self._store is not None:
            self._store.set_cap(max(0, int(cap_bytes)))

    # ---- images, encoded on attach --------------------------------------------------------

    def _progress(self, key: int):
        """A Session.vision_progress that reports blocks done, then the encode's time."""
        start = [0.0]

        def report(done: int, depth: int) -> None:
            import time

            if done == 0:
                start[0] = time.perf_counter()
            state, secs = "encoding", 0.0
            if done == depth:
                state, secs = "done", time.perf_counter() - start[0]
            self.sig_image.emit(ImageStatus(key, state, seconds=secs, done=done, depth=depth))

        return report

    @Slot(object)
    def encode_image(self, job: ImageJob) -> None:
        """Prepare and encode an attached image into the model's embedding cache, and in the
        chat shown compute the rows of a turn that starts with it (Session.prefill_ahead),
        so the answer that sends it waits only for what is left: its text, if this
        finished."""
        from merlin.engine.vision import cost
        from merlin.engine.vision.budget import BudgetedImage
        from merlin.engine.vision.encoder import EncodeCancelled

        model = self._model
        if job.cancel.is_set():
            self.sig_image.emit(ImageStatus(job.key, "cancelled"))
            return
        if model is None or model.vision is None or not model.vision.available:
            return  # the answer says why, if the image is sent
        s = self._session
        if s is None and self._session_key is None:  # a new chat: its session starts here
            s = Session(model, job.options.system_prompt, session_settings(job.options))
            self._session = s
        elif s is None or s.model is not model:
            s = Session(model, job.options.system_prompt, session_settings(job.options))
        if not self._engine_turn(job.cancel):
            self.sig_image.emit(ImageStatus(job.key, "cancelled"))
            return
        try:
            try:  # the lock goes back whatever fails (a picture refused for its budget too)
                im = s.image(BudgetedImage(job.path, job.tokens))
                secs = cost.estimate_seconds(model.vision.encoder, [im.grid_thw])
                self.sig_image.emit(ImageStatus(job.key, "estimate", im.n_tokens, secs))
                s.vision_progress = self._progress(job.key)
                s.encode_image(im, job.cancel)
                if s is self._session:  # the chat shown: its next turn's rows, while typing
                    self._prefill_ahead(s, job, im)
            finally:
                s.vision_progress = None
                self.engine_lock.release()
        except EncodeCancelled:
            self.sig_image.emit(ImageStatus(job.key, "cancelled"))
        except MerlinError as e:
            self.sig_image.emit(ImageStatus(job.key, "error", message=str(e)))
        except Exception as e:  # an engine bug: say so on the image, keep the app alive
            traceback.print_exc()
            self.sig_image.emit(ImageStatus(job.key, "error", message=f"{type(e).__name__}: {e}"))

    @staticmethod
    def _prefill_ahead(s: Session, job: ImageJob, image) -> None:
        """Session.prefill_ahead for an encoded image, after the attachments ahead of it that
        are encoded (one removed since is not). Only time is at stake: a turn that cannot be
        computed now says why when it is sent, not on the image."""
        from merlin.engine.vision.budget import BudgetedImage

        try:
            shared = s.model.vision.embeddings
            earlier = [s.image(BudgetedImage(p, t)) for p, t in job.before]
            earlier = [im for im in earlier if shared.get(im.hash) is not None]
            s.prefill_ahead([*earlier, image], job.cancel)
        except MerlinError as e:
            log.info("rows of the attached image not computed ahead: %s", e)
        except Exception:
            log.warning("rows of the attached image not computed ahead", exc_info=True)

    # ---- the context meter ----------------------------------------------------------------

    @Slot(object)
    def count(self, box) -> None:
        """Count the latest CountJob in `box` (a LatestBox; None: already counted)."""
        from merlin.app.model.counting import CountReport

        job = box.take()
        if job is None:
            return
        if self._model is None or self._remote is not None:
            self.sig_count.emit(CountReport(job.serial, False))
            return
        try:
            turns, _ = without_refused_images(job.turns)
            s = self._session_for(job.conversation_id, turns[:-1], job.options)
            c = s.count(session_messages(turns), answer_options(self._model, job.options))
        except Exception as e:  # a count never breaks the app; the meter says it is unknown
            log.info("the context meter could not count: %s", e)
            self.sig_count.emit(CountReport(job.serial, False))
            return
        self.sig_count.emit(CountReport(job.serial, True, c.tokens, c.image_tokens, c.budget,
                                        c.reserve, c.dropped, c.fits, c.problem,
                                        s.cache_bytes))  # fmt: skip

    # ---- generation ----------------------------------------------------------------------

    @Slot(object)
    def generate(self, job: GenerationJob) -> None:
        from merlin.engine.generate import Finished

        try:
            if self._remote is not None:  # a remote server answers (model/remote.py)
                turns, refused = without_refused_images(job.turns)
                for event in self._remote.respond(turns, job.options, job.cancel):
                    self._note_refused(job, refused, event)
                    self.sig_event.emit(job.job_id, event)
                return
            if self._model is None:
                self.sig_failed.emit(job.job_id, "no model is loaded yet.")
                return
            if job.cancel.is_set() or not self._engine_turn(job.cancel):
                self.sig_event.emit(job.job_id, Finished("cancelled"))
                return
            try:
                self._answer(job)
            finally:
                self.engine_lock.release()
        except MerlinError as e:
            self.sig_failed.emit(job.job_id, str(e))
        except MemoryError:
            self._drop_session()
            self.sig_failed.emit(job.job_id, "out of memory while answering.")
        except Exception as e:
            traceback.print_exc()
            self._drop_session()  # an engine bug: start the next turn from a clean session
            self.sig_failed.emit(
                job.job_id, f"the engine failed unexpectedly ({type(e).__name__}: {e})."
            )
        finally:
            self.sig_job_done.emit(job.job_id)

    @staticmethod
    def _note_refused(job: GenerationJob, refused: list[str], event) -> None:
        """Earlier pictures left out (history.without_refused_images): said on the answer's
        end, and kept with it."""
        from merlin.engine.generate import Finished

        if refused and isinstance(event, Finished):
            names = [job.image_names.get(p) or Path(p).name for p in refused]
            event.notices.append(missing_images_notice(names, tr))

    def _answer(self, job: GenerationJob) -> None:
        from merlin.engine.generate import Finished
        from merlin.engine.threads import set_threads

        set_threads(job.options.threads or None)
        turns, refused = without_refused_images(job.turns)
        session = self._session_for(job.conversation_id, turns, job.options)
        session.vision_progress = self._progress(GENERATION_KEY)
        events = session.respond(
            session_messages(turns),
            answer_options(self._model, job.options),
            cancel=job.cancel,
        )
        ended = False
        for event in events:
            self._note_refused(job, refused, event)
            self.sig_event.emit(job.job_id, event)
            ended = ended or isinstance(event, Finished)
        if ended:  # finished or stopped: the next answer starts from here, even later
            self._save_session()


def thinking_info(tokenizer) -> dict:
    """ModelInfo's thinking fields (engine.thinking.support)."""
    from merlin.engine.thinking import support

    s = support(tokenizer)
    return dict(
        thinking=s.supported,
        thinking_switchable=s.switchable,
        thinking_always=s.opens,
        thinking_reason=s.reason,
    )


def _is_demo_model(folder) -> bool:
    from merlin.engine.demo_model import is_demo_model

    return is_demo_model(folder)


def _is_random_checkpoint(folder) -> bool:
    from merlin.engine import demo

    try:
        name = str(folder)
        return any(spec.name in name for spec in (demo.DEMO, demo.QWEN3VL_2B))
    except Exception:
        return False


def _image_presets(vision) -> dict:
    """Image tokens of each detail preset for this checkpoint's preprocessing (a model with
    smaller limits than Qwen3-VL's had every preset refused)."""
    from merlin.engine.vision.budget import PRESETS, preset_tokens

    if vision is None:
        return {}
    return {name: preset_tokens(name, vision.preprocess) for name in PRESETS}
