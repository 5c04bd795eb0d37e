"""The engine in a QThread: loads the model and runs generations off the GUI thread.

Signals carry plain engine events; the GUI owns every widget and model it shows, the worker
never touches them.
"""

from __future__ import annotations

import threading
import traceback

from PySide6.QtCore import QObject, Signal, Slot

from engine.errors import MerlinError


class EngineWorker(QObject):
    """Lives in a worker thread.

    sig_loaded(str): the model is ready; argument describes it.
    sig_load_failed(str): loading failed; argument is the message for the user.
    sig_progress(float, str): loading progress 0..1 and the phase.
    sig_event(object): one generation event (PrefillDone, Tokens, Finished).
    sig_failed(str): generation failed; the message for the user.
    """

    sig_loaded = Signal(str)
    sig_load_failed = Signal(str)
    sig_progress = Signal(float, str)
    sig_event = Signal(object)
    sig_failed = Signal(str)

    def __init__(self):
        super().__init__()
        self.model = None
        self.cancel = threading.Event()

    @Slot(str)
    def load(self, folder: str) -> None:
        from engine.demo import ensure_demo_checkpoint
        from engine.model import load_model

        try:
            path = folder or str(ensure_demo_checkpoint())
            self.model = load_model(
                path, progress=lambda f, phase: self.sig_progress.emit(f, phase)
            )
            self.sig_loaded.emit(self.model.config.describe())
        except MerlinError as e:
            self.sig_load_failed.emit(str(e))
        except Exception as e:  # an engine bug: report it, keep the app alive
            traceback.print_exc()
            self.sig_load_failed.emit(f"Loading failed unexpectedly: {e}")

    @Slot(str)
    def generate(self, text: str) -> None:
        from engine.generate import GenerationRequest, generate
        from engine.prompt import chat_prompt_ids

        self.cancel.clear()
        try:
            prompt = chat_prompt_ids(self.model.tokenizer, text)
            request = GenerationRequest(prompt_ids=prompt, sampling=self.model.defaults.sampling)
            for event in generate(self.model, request, cancel=self.cancel):
                self.sig_event.emit(event)
        except MerlinError as e:
            self.sig_failed.emit(str(e))
        except Exception as e:
            traceback.print_exc()
            self.sig_failed.emit(f"Generation failed unexpectedly: {e}")
