"""Moving small host data to the device without stalling the stream."""

from __future__ import annotations

import numpy as np
import torch

_NUMPY = {torch.int64: np.int64, torch.int32: np.int32}


def host_to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A python list as a tensor on device; on CUDA through pinned memory, so the copy is queued
    behind the running step instead of waiting for it (a pageable copy synchronizes the stream)."""
    t = torch.tensor(data, dtype=dtype)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class Staging:
    """Packs a step's numpy integer arrays into one host buffer per dtype and moves each in one copy.

    On CUDA the buffers are pinned and reused: there are two sets, used in turn, and a set is
    refilled only after the copy that last read it has run (an event per set), so the host can fill
    step N+1's inputs while step N's copy is still queued. On the CPU the packed arrays are the
    tensors (fresh each step: nothing may alias a tensor the previous step handed out)."""

    def __init__(self, device: torch.device, sets: int = 2) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self.buffers: list[dict[torch.dtype, tuple[torch.Tensor, np.ndarray]]] = [{} for _ in range(sets)]
        self.events: list[torch.cuda.Event | None] = [None] * sets
        self.turn = 0

    def upload(
        self,
        parts: dict[torch.dtype, list[np.ndarray]],
        into: dict[torch.dtype, torch.Tensor] | None = None,
    ) -> dict[torch.dtype, torch.Tensor]:
        """{dtype: arrays} -> {dtype: the arrays concatenated, on the device} (dtypes with data only).
        `into`: device buffers (one per dtype, large enough) that receive them, from their start; the
        result is then views of them."""
        if not self.pinned:
            out = {
                dt: torch.from_numpy(np.concatenate(arrays).astype(_NUMPY[dt], copy=False))
                for dt, arrays in parts.items()
                if sum(a.size for a in arrays)
            }
            if into is not None:
                for dt, t in out.items():
                    out[dt] = into[dt][: t.numel()].copy_(t)
            return out
        i = self.turn
        self.turn = (i + 1) % len(self.buffers)
        event = self.events[i]
        if event is not None:
            event.synchronize()  # the copy that read this set last (done long ago, normally)
        out = {}
        for dt, arrays in parts.items():
            n = sum(a.size for a in arrays)
            if not n:
                continue
            held = self.buffers[i].get(dt)
            if held is None or held[1].size < n:
                size = max(n, 2 * held[1].size if held is not None else 4096)
                buf = torch.empty(size, dtype=dt, pin_memory=True)
                held = self.buffers[i][dt] = (buf, buf.numpy())
            np.concatenate(arrays, out=held[1][:n])
            if into is not None:
                out[dt] = into[dt][:n].copy_(held[0][:n], non_blocking=True)
            else:
                out[dt] = held[0][:n].to(self.device, non_blocking=True)
        if event is None:
            event = self.events[i] = torch.cuda.Event()
        event.record()
        return out
