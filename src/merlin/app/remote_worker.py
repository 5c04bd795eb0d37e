"""The worker's side of a remote engine: "loading" an OpenAI-compatible server.

Called by EngineWorker.load (app/worker.py) on the engine thread when a LoadRequest carries a
RemoteConfig: the server is asked for its models (which proves the address and the key), the
model is chosen (the configured one, else the first the server lists), and the worker answers
with the server from now on (EngineWorker.generate sends jobs to RemoteBackend.respond). A
failure leaves the worker as it was, so the previous engine stays in use.
"""

from __future__ import annotations

import dataclasses
import time

from merlin.app.model.remote import LIST_TIMEOUT, RemoteBackend, RemoteError, list_models, waited


def connect(worker, request) -> None:
    from merlin.app.worker import ModelInfo

    config = request.remote
    t0 = time.perf_counter()
    worker.sig_load_progress.emit(0.1, "connecting to the server")
    try:
        answered, models = waited(lambda: list_models(config), request.cancel, LIST_TIMEOUT)
        if request.cancel.is_set():
            worker.sig_load_cancelled.emit()
            return
        if not answered:
            raise RemoteError(
                f"{config.shown_url} sent no model list within {LIST_TIMEOUT:g} s. Is it an "
                "OpenAI-compatible server, and is it busy?"
            )
        if not models:
            raise RemoteError(f"{config.shown_url} offers no models.")
        model = config.model or models[0]
        if model not in models:
            raise RemoteError(
                f"{config.shown_url} has no model {model!r}; it offers {', '.join(models[:8])}."
            )
    except RemoteError as e:
        worker.sig_load_failed.emit(str(e))
        return
    except Exception as e:  # never a load without an end (the window waited for good)
        worker.sig_load_failed.emit(f"the server could not be asked ({type(e).__name__}: {e}).")
        return
    if request.cancel.is_set():
        worker.sig_load_cancelled.emit()
        return
    config = dataclasses.replace(config, model=model)
    worker._model, worker._remote = None, RemoteBackend(config)
    worker.sig_load_progress.emit(1.0, "ready")
    worker.sig_loaded.emit(
        ModelInfo(
            source=request.source,
            folder=config.shown_url,
            name=model,
            description=f"OpenAI-compatible server at {config.shown_url}",
            weights="remote",
            kv="remote",
            random_weights=False,
            vision=True,  # the server says so when it cannot take images
            vision_problem="",
            max_context=0,
            weight_bytes_per_token=0,
            load_s=time.perf_counter() - t0,
        )
    )
