"""Values built once per live object (a tokenizer, a vocabulary) and a few extra key parts.

Entries are keyed by id(object) and hold the object itself, so an id is never reused by another
object while its entry exists; a hit also checks identity. Builds run under the cache's lock: two
threads asking for the same value build it once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class PerObjectCache(Generic[V]):
    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[object, V]] = {}
        self._lock = threading.RLock()

    def get(self, obj: object, extra: tuple, build: Callable[[], V]) -> V:
        key = (id(obj), *extra)
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[0] is not obj:
                hit = (obj, build())
                self._entries[key] = hit
            return hit[1]

    def __len__(self) -> int:
        return len(self._entries)
