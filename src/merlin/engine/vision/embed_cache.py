"""Recent image embeddings of a loaded model, shared by its sessions, bounded in bytes.

An image is encoded when it is attached, before the question exists (and before the app knows
which conversation, hence which Session, it will belong to); the session that answers finds
the embedding here. Keys are engine.session.image_hash values, which cover the prepared pixels,
the grid, the image-token budget and the vision weights format: the same picture at another
budget, or encoded by the other weights format, is another entry. Least recently used entries
go first once the cache holds more than cap_bytes. Thread-safe (the engine thread writes, a
bench or test may read).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

DEFAULT_CAP_BYTES = 256 * 1024**2  # ~20 images of 1024 tokens of the 2B model (4 x 2048 f32)


class EmbeddingCache:
    def __init__(self, cap_bytes: int = DEFAULT_CAP_BYTES):
        self.cap_bytes = int(cap_bytes)
        self._items: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _size(emb) -> int:
        return int(emb.embeds.nbytes + emb.deepstack.nbytes)

    def get(self, key: str):
        with self._lock:
            emb = self._items.get(key)
            if emb is not None:
                self._items.move_to_end(key)
            return emb

    def put(self, key: str, emb) -> None:
        with self._lock:
            self._items[key] = emb
            self._items.move_to_end(key)
            total = sum(self._size(e) for e in self._items.values())
            while total > self.cap_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                total -= self._size(old)

    def discard(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
