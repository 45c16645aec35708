"""Grammar bitmask rows kept on the device for the fused sampler (CUDA).

A constraint whose row is shared by every request in the same state names it with a key
(`mask_key`); the table's first `capacity` rows cache rows by that key, least recently used out
first. The grammar's constraints return no key (llguidance's state is each request's own), so for
them only the upload path below is used; a step uploads only the rows it had to compute, into the
last `scratch` rows, and a (batch,) index telling the sampler which row each logits row reads.

Stream order makes the reuse safe: a step's uploads and copies are queued after the previous step's
sampling, which read the rows they overwrite. A cached row is never evicted by the step that reads
it: rows read in a step are the most recently used ones and the cache holds more than a batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np
import torch


class DeviceMasks:
    def __init__(self, words: int, scratch: int, capacity: int, device: torch.device) -> None:
        if capacity < 2 * scratch:
            raise ValueError("the mask cache must hold at least two batches of rows")
        self.words, self.scratch, self.capacity = words, scratch, capacity
        self.device = device
        pinned = device.type == "cuda"
        # (capacity + scratch, words) int32: cached rows, then this step's computed rows
        self.table = torch.zeros((capacity + scratch, words), dtype=torch.int32, device=device)
        self.staging = torch.empty((scratch, words), dtype=torch.int32, pin_memory=pinned)
        # (batch + 2 * scratch,) int32 per step: each row's table row, then cache slots and their sources
        self._index = torch.empty(3 * scratch, dtype=torch.int32, pin_memory=pinned)
        self._slots: OrderedDict[Hashable, int] = OrderedDict()
        self._free = list(range(capacity - 1, -1, -1))
        self.hits = self.misses = 0

    def lookup(self, key: Hashable) -> int | None:
        """The cached row of `key` (marked used), or None."""
        slot = self._slots.get(key)
        if slot is None:
            self.misses += 1
            return None
        self._slots.move_to_end(key)
        self.hits += 1
        return slot

    def _insert(self, key: Hashable) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            _, slot = self._slots.popitem(last=False)
        self._slots[key] = slot
        return slot

    def scratch_row(self, local: int) -> int:
        return self.capacity + local

    def upload(self, rows: np.ndarray, computed: int, keep: list[tuple[int, Hashable]]) -> torch.Tensor:
        """Queues this step's work; returns the (batch,) int32 device index for the sampler.

        rows: (batch,) table row of each logits row (-1: no mask); `computed` staging rows were
        filled this step; keep: (staging row, key) of the computed rows to cache."""
        batch = rows.shape[0]
        if computed > self.scratch or batch + 2 * len(keep) > self._index.shape[0]:
            raise ValueError("more mask rows in one step than the table was sized for")
        if computed:
            scratch = self.table[self.capacity : self.capacity + computed]
            scratch.copy_(self.staging[:computed], non_blocking=True)
        idx = self._index.numpy()
        idx[:batch] = rows
        k = len(keep)
        for j, (local, key) in enumerate(keep):
            idx[batch + j] = self._insert(key)
            idx[batch + k + j] = self.scratch_row(local)
        dev = self._index[: batch + 2 * k].to(self.device, non_blocking=True)
        if k:
            self.table.index_copy_(0, dev[batch : batch + k].long(), self.table[dev[batch + k :].long()])
        return dev[:batch]

    def clear(self) -> None:
        self._slots.clear()
        self._free = list(range(self.capacity - 1, -1, -1))
