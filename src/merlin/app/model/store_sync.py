"""The chat store's background syncer: commits made durable off the committing thread."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

CHECKPOINT_BYTES = 4 << 20  # the background syncer checkpoints a WAL larger than this
SYNC_RETRY_S = 0.5  # after a failed sync (disk error), try again this much later
log = logging.getLogger(__name__)


class Syncer:
    """Makes commits durable off the committing thread: after each request() it fsyncs the
    WAL file, which is what `synchronous=FULL` does inside each commit (the frames of every
    committed transaction are then on disk; SQLite replays them after a power cut). When
    the WAL has grown past CHECKPOINT_BYTES it also checkpoints it into the database file
    (on its own connection: sync the WAL, copy, sync the database). Checkpoints stay rare on
    purpose: the first commit after one restarts the WAL, and SQLite syncs the new WAL header
    in the committing thread. The sqlite3 module and os.fsync let go of the GIL while they
    wait for the disk."""

    def __init__(self, path: str):
        self._path = path
        self._cond = threading.Condition()
        self._requested = 0  # commits so far
        self._synced = 0  # commits known to be on disk
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="merlin-store-sync", daemon=True)
        self._thread.start()

    def request(self) -> None:
        with self._cond:
            self._requested += 1
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            target = self._requested
            self._cond.wait_for(
                lambda: self._synced >= target or not self._thread.is_alive(), timeout
            )
            return self._synced >= target

    def close(self, timeout: float = 10.0) -> None:
        self.wait(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        db: sqlite3.Connection | None = None  # for checkpoints only
        fd: int | None = None  # the WAL file
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._requested > self._synced or self._closing)
                    if self._requested <= self._synced:
                        return  # closing, nothing left
                    target = self._requested
                try:
                    if fd is None:
                        fd = os.open(self._path + "-wal", os.O_RDONLY)
                    os.fsync(fd)
                    if os.fstat(fd).st_size > CHECKPOINT_BYTES:
                        if db is None:
                            db = sqlite3.connect(self._path, isolation_level=None, timeout=5.0)
                        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except (OSError, sqlite3.Error) as e:
                    if self._closing:
                        return  # the store's own connection checkpoints when it closes
                    log.warning("chat store: syncing to disk failed (%s); trying again", e)
                    time.sleep(SYNC_RETRY_S)
                    continue
                with self._cond:
                    self._synced = target
                    self._cond.notify_all()
        finally:
            if fd is not None:
                os.close(fd)
            if db is not None:
                db.close()
            with self._cond:
                self._cond.notify_all()  # waiters see the thread gone
