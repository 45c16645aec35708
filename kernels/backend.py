"""Which implementation a tensor's op takes: Triton kernels for CUDA tensors, torch references otherwise.

`CHATLOOM_KERNELS=torch` forces the references (read at every call, so tests can flip it). Importing
this module never imports triton (kernels.dispatch and its parts import the kernel modules on the first
CUDA call).
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """True when `t` lives on CUDA, triton imports and CHATLOOM_KERNELS is not 'torch'."""
    if t.device.type != "cuda":
        return False
    if os.environ.get("CHATLOOM_KERNELS", "").lower() == "torch":
        return False
    return triton_available()


def backend(t: torch.Tensor) -> str:
    return "triton" if use_triton(t) else "torch"
