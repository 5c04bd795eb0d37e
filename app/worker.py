"""The engine in a QThread: loads models and runs generations off the GUI thread.

The worker owns the loaded Model; the GUI never touches it. Requests arrive by queued signals
(plain dataclasses), results leave by signals carrying plain engine events. Cancellation uses
threading.Events the GUI sets directly, because the worker is busy when it matters.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal, Slot

from engine import warmup
from engine.errors import MerlinError

from . import pyside_fixes
from .prompting import GenerationOptions, Turn, build_request

pyside_fixes.install()

SOURCE_DEMO = "demo"
SOURCE_RANDOM_2B = "random-2b"


@dataclass
class LoadRequest:
    source: str  # SOURCE_DEMO, SOURCE_RANDOM_2B or a checkpoint folder
    weights: str = "f32"
    kv: str = "f32"
    warm_up: bool = True  # compile (or load cached) kernels now, not at the first question
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class ModelInfo:
    """What the GUI may know about the loaded model (plain values only)."""

    source: str
    folder: str
    name: str
    description: str
    weights: str
    kv: str
    random_weights: bool  # demo or the 2B-shaped random checkpoint: answers are random text
    vision: bool
    vision_problem: str
    max_context: int
    weight_bytes_per_token: int
    load_s: float


@dataclass
class GenerationJob:
    job_id: int
    turns: list[Turn]
    options: GenerationOptions
    cancel: threading.Event = field(default_factory=threading.Event)


class _LoadCancelled(Exception):
    pass


def describe_source(source: str) -> str:
    if source == SOURCE_DEMO:
        return "Merlin demo (random weights)"
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
    """

    sig_load_progress = Signal(float, str)
    sig_loaded = Signal(object)
    sig_load_failed = Signal(str)
    sig_load_cancelled = Signal()
    sig_event = Signal(int, object)
    sig_failed = Signal(int, str)
    sig_job_done = Signal(int)

    def __init__(self):
        super().__init__()
        self._model = None

    # ---- loading -------------------------------------------------------------------------

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        from engine.model import load_model

        def progress(fraction: float, phase: str) -> None:
            if request.cancel.is_set():
                raise _LoadCancelled
            self.sig_load_progress.emit(float(fraction), phase)

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
            )
            if request.warm_up:
                self._warm_up(model, progress)
            progress(1.0, "ready")
        except (_LoadCancelled, warmup.WarmupCancelled):
            self.sig_load_cancelled.emit()
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
        self._model = model
        vision = model.vision
        self.sig_loaded.emit(
            ModelInfo(
                source=request.source,
                folder=str(model.folder),
                name=describe_source(request.source),
                description=model.config.describe(),
                weights=model.weights_fmt,
                kv=model.kv_fmt,
                random_weights=request.source in (SOURCE_DEMO, SOURCE_RANDOM_2B)
                or _is_random_checkpoint(model.folder),
                vision=bool(vision and vision.available),
                vision_problem=(vision.problem or "") if vision else "",
                max_context=model.max_context,
                weight_bytes_per_token=model.bytes_per_token,
                load_s=model.load_s,
            )
        )

    @staticmethod
    def _resolve(source: str, progress) -> str:
        from engine import demo

        if source == SOURCE_DEMO or not source:
            return str(demo.ensure_demo_checkpoint())
        if source == SOURCE_RANDOM_2B:
            folder = demo.random_checkpoint_dir(demo.QWEN3VL_2B)
            if not (folder / "model.safetensors").is_file():
                progress(0.01, "building the 2B-shaped random checkpoint (first time only)")
            return str(demo.ensure_random_checkpoint(demo.QWEN3VL_2B))
        return source

    @staticmethod
    def _warm_up(model, progress) -> None:
        """Run every kernel once so Numba compiles them (or loads its disk cache) now."""
        from engine.generate import GenerationRequest, generate
        from engine.sampling import SamplingParams

        progress(0.94, "compiling kernels (first start only)")
        ids = model.tokenizer.encode_text("Hello")
        greedy = SamplingParams(temperature=0.0)
        request = GenerationRequest(
            prompt_ids=ids, sampling=greedy, max_new_tokens=2, ignore_eos=True
        )
        for _ in generate(model, request, max_context=64):
            pass
        if model.vision is not None and model.vision.available:
            # an image prompt and two decode steps after it (3D positions, rope delta)
            progress(0.96, "compiling the vision kernels (first start only)")
            from PIL import Image

            from engine.prompt import build_prompt
            from engine.vision import prepare_pil

            cfg = model.vision.preprocess.with_max_pixels(model.vision.preprocess.factor**2 * 4)
            image = prepare_pil(Image.new("RGB", (64, 64), (128, 128, 128)), cfg, "warm-up")
            prompt = build_prompt(model.tokenizer, model.config, "Hi", [image])
            request = GenerationRequest(
                prompt_ids=prompt.ids, sampling=greedy, max_new_tokens=2, ignore_eos=True,
                images=prompt.images, positions=prompt.positions, rope_delta=prompt.rope_delta,
            )  # fmt: skip
            for _ in generate(model, request, max_context=len(prompt.ids) + 8):
                pass

    # ---- generation ----------------------------------------------------------------------

    @Slot(object)
    def generate(self, job: GenerationJob) -> None:
        from engine.generate import Finished, generate
        from engine.threads import set_threads

        try:
            if self._model is None:
                self.sig_failed.emit(job.job_id, "no model is loaded yet.")
                return
            if job.cancel.is_set():
                self.sig_event.emit(job.job_id, Finished("cancelled", {"generated_tokens": 0}))
                return
            model = self._model
            set_threads(job.options.threads or None)
            max_pixels = job.options.max_pixels or None
            paths = [p for turn in job.turns for p in turn.images]
            images = [model.vision.prepare(p, max_pixels) for p in paths] if paths else []
            request, kwargs = build_request(model, job.turns, job.options, images)
            for event in generate(model, request, cancel=job.cancel, **kwargs):
                self.sig_event.emit(job.job_id, event)
        except MerlinError as e:
            self.sig_failed.emit(job.job_id, str(e))
        except MemoryError:
            self.sig_failed.emit(job.job_id, "out of memory while answering.")
        except Exception as e:
            traceback.print_exc()
            self.sig_failed.emit(
                job.job_id, f"the engine failed unexpectedly ({type(e).__name__}: {e})."
            )
        finally:
            self.sig_job_done.emit(job.job_id)


def _is_random_checkpoint(folder) -> bool:
    from engine import demo

    try:
        name = str(folder)
        return any(spec.name in name for spec in (demo.DEMO, demo.QWEN3VL_2B))
    except Exception:
        return False
