"""Moving small host data to the device without stalling the stream."""

from __future__ import annotations

import torch


def host_to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A python list as a tensor on device; on CUDA through pinned memory, so the copy is queued
    behind the running step instead of waiting for it (a pageable copy synchronizes the stream)."""
    t = torch.tensor(data, dtype=dtype)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)
