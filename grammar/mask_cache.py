"""Grammar masks by budget-DFA state, shared by every request of a grammar.

When the budget automaton compiles the very regex the backend compiles (tool calls, JSON schemas;
not free text, where it compiles a superset), its DFA state after a request's bytes is the
request's residual language, and the backend's mask is a function of that language. Requests in
the same state (and one request coming back to it) get the same row: computed once, then copied.
One process-wide LRU bounded in bytes (CHATLOOM_MASK_CACHE_MB, default 256).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np


class MaskCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # (id(grammar), state) -> (grammar, (words,) uint32 row); the grammar is held so its id stays its own
        self._rows: OrderedDict[tuple[int, int], tuple[object, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, grammar: object, state: int) -> np.ndarray | None:
        key = (id(grammar), state)
        with self._lock:
            hit = self._rows.get(key)
            if hit is None or hit[0] is not grammar:
                self.misses += 1
                return None
            self._rows.move_to_end(key)
            self.hits += 1
            return hit[1]

    def put(self, grammar: object, state: int, row: np.ndarray) -> None:
        key = (id(grammar), state)
        row = row.copy()
        with self._lock:
            old = self._rows.pop(key, None)
            if old is not None:
                self.bytes -= old[1].nbytes
            self._rows[key] = (grammar, row)
            self.bytes += row.nbytes
            while self.bytes > self.max_bytes and self._rows:
                _, (_, dropped) = self._rows.popitem(last=False)
                self.bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self.bytes = self.hits = self.misses = 0


_cache = MaskCache(int(os.environ.get("CHATLOOM_MASK_CACHE_MB", "256")) << 20)


def mask_cache() -> MaskCache:
    return _cache
