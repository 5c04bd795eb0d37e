"""One generation at a time, on one thread, with a bounded queue in front of it.

The engine uses every core for one answer, so answers run one after the other. `submit()`
puts a job in line or, when `max_waiting` jobs already wait, raises ApiError 429 with a
Retry-After header (seconds: the jobs ahead times the mean duration of recent jobs). The
generation thread runs a job's `start()` (checks, then the event iterator) and sends each
item to the job's asyncio queue on the server's event loop: ("event", e), then ("end", None)
or ("error", exception). Setting `job.cancel` (the client went away, a stop string) ends the
generation at its next step; a job cancelled while it waits is skipped.

`engine_lock` (optional): held while a job computes, when the model is shared with another
user of it in the same process (the app serving its loaded model: its own answers take the
same lock), so two forwards never run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator

from .errors import ApiError

log = logging.getLogger(__name__)
FIRST_TOKEN_WAIT_S = 0.05


class Job:
    def __init__(self, start: Callable[[threading.Event], Iterator], loop):
        self.start = start
        self.cancel = threading.Event()
        # streams: the generation thread waits (at most FIRST_TOKEN_WAIT_S) until the first
        # text is on its way to the client before computing on: otherwise the event loop that
        # writes it must find a CPU while the next step's kernel threads hold every core,
        # which on a busy host delayed the first token by tens of ms
        self.first_sent: threading.Event | None = None
        self.loop = loop
        self.items: asyncio.Queue = asyncio.Queue()

    def put(self, kind: str, value=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed (shutdown)
            self.cancel.set()

    async def next(self):
        return await self.items.get()


class GenerationQueue:
    def __init__(self, max_waiting: int = 8, engine_lock=None):
        self.max_waiting = max(0, int(max_waiting))
        self._engine_lock = engine_lock if engine_lock is not None else contextlib.nullcontext()
        self._q: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._line: list[Job] = []  # submitted, not yet taken by the generation thread
        self.busy = False
        self._current: Job | None = None  # the job being computed
        self._mean_s = 5.0
        self._thread = threading.Thread(target=self._run, name="merlin-generation", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs in line whose client still waits (one that left is skipped when reached, and
        holds no place meanwhile)."""
        with self._lock:
            return sum(not job.cancel.is_set() for job in self._line)

    def submit(self, start: Callable[[threading.Event], Iterator]) -> Job:
        """A job for `start(cancel) -> events`, queued (ApiError 429 when the queue is full)."""
        waiting = self.waiting
        with self._lock:
            if waiting >= self.max_waiting and (self.busy or waiting):
                ahead = waiting + int(self.busy)
                retry = max(1, min(600, math.ceil(ahead * self._mean_s)))
                raise ApiError(
                    f"the server is busy: {ahead} request(s) ahead and the queue is full "
                    f"({self.max_waiting} waiting); try again in {retry} s.",
                    None,
                    status=429,
                    code="queue_full",
                    headers={"Retry-After": str(retry)},
                )
            job = Job(start, asyncio.get_running_loop())
            self._line.append(job)
        self._q.put(job)
        return job

    def cancel_all(self) -> None:
        """Stop the job being computed at its next step and every job in line (the server is
        stopping): their clients get an error, not an answer that looks finished."""
        with self._lock:
            jobs = [*self._line, *([self._current] if self._current is not None else [])]
        for job in jobs:
            job.cancel.set()

    def close(self, timeout: float = 5.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            with self._lock:
                self._line.remove(job)
                self.busy, self._current = True, job
            t0 = time.perf_counter()
            try:
                if job.cancel.is_set():  # its client left, or the server is stopping
                    job.put("error", ApiError("the server stopped first.", None, status=503))
                    continue
                with self._engine_lock:
                    self._compute(job)
                job.put("end")
            except ApiError as e:
                job.put("error", e)
            except MemoryError:
                job.put("error", ApiError("out of memory while answering.", None, status=503))
            except Exception as e:  # an engine bug: logged here, a plain 500 for the client
                log.error("generation failed:\n%s", traceback.format_exc())
                job.put(
                    "error",
                    ApiError(
                        f"the engine failed unexpectedly ({type(e).__name__}); see the server log.",
                        None,
                        status=500,
                    ),
                )
            finally:
                dt = time.perf_counter() - t0
                self._mean_s = 0.8 * self._mean_s + 0.2 * dt
                with self._lock:
                    self.busy, self._current = False, None

    @staticmethod
    def _compute(job: Job) -> None:
        first = True
        for event in job.start(job.cancel):
            job.put("event", event)
            if first and job.first_sent is not None and getattr(event, "text", ""):
                first = False
                job.first_sent.wait(FIRST_TOKEN_WAIT_S)
