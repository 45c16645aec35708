"""A step graph's sampled ids written by the device straight into pinned host memory (matches
reference.publish_tokens), so that no copy to the host runs after the graph.

The host buffer is a ring of SLOTS rows: the launch writes row `counter % SLOTS` and advances the
counter (a device int64 the graph keeps), so the graph's pointers stay fixed while the host reads the
row of replay k during replay k + 1. The device reaches pinned memory through unified addressing; a
`Mapped` wrapper hands Triton its address (a CPU tensor would send the launch to the interpreter).
At batch 1 the step's lm_head launch publishes its tokens itself (kernels.lm_head_sample); this launch
ends the step graphs of 2 to 8 sequences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import kernel, next_pow2


class Mapped:
    """A pinned host tensor as a Triton pointer argument (the device reads and writes it over PCIe)."""

    def __init__(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or not t.is_pinned():
            raise ValueError("a mapped buffer must be pinned host memory")
        self.t = t
        self.dtype = t.dtype

    def data_ptr(self) -> int:
        return self.t.data_ptr()


@kernel
def _publish_kernel(
    tokens_ptr,  # (size,) int64 on the device
    ring_ptr,  # (SLOTS, n) int64, pinned host memory
    counter_ptr,  # (1,) int64 on the device: launches so far
    size,
    n,
    SLOTS: tl.constexpr,
    BLOCK: tl.constexpr,  # >= size
):
    i = tl.arange(0, BLOCK)
    inside = i < size
    write_ring_row(ring_ptr, counter_ptr, n, i, tl.load(tokens_ptr + i, mask=inside), inside, SLOTS)


@triton.jit
def write_ring_row(ring_ptr, counter_ptr, n, cols, tokens, mask, SLOTS: tl.constexpr):
    """tokens (int64, at cols where mask) into ring row counter % SLOTS, then counter + 1 (a helper of
    this launch and of kernels.lm_head_sample's, which ends a step by publishing its draw itself)."""
    c = tl.load(counter_ptr)
    tl.store(ring_ptr + (c % SLOTS) * n + cols, tokens, mask=mask)
    tl.store(counter_ptr, c + 1)


def ring_target(ring: torch.Tensor, counter: torch.Tensor, size: int, device: torch.device):
    """Checks a host ring (slots, n >= size) int64 and its (1,) int64 counter on `device`; returns what a
    launch on that device takes for the ring (a Mapped wrapper on CUDA)."""
    if ring.dtype != torch.int64 or ring.dim() != 2 or not ring.is_contiguous() or ring.shape[1] < size:
        raise ValueError(f"the ring must be (slots, >= {size}) int64, contiguous")
    if counter.shape != (1,) or counter.dtype != torch.int64 or counter.device != device:
        raise ValueError("the ring's counter must be (1,) int64 beside the tokens")
    return Mapped(ring) if device.type == "cuda" else ring


def publish_tokens(
    tokens: torch.Tensor,  # (size,) int64
    ring: torch.Tensor,  # (slots, n) int64, n >= size; pinned host memory on CUDA
    counter: torch.Tensor,  # (1,) int64 beside tokens
) -> None:
    size = tokens.shape[0]
    if tokens.dtype != torch.int64:
        raise ValueError("tokens must be int64")
    target = ring_target(ring, counter, size, tokens.device)
    _publish_kernel[(1,)](
        tokens, target, counter, size, ring.shape[1], SLOTS=ring.shape[0], BLOCK=next_pow2(size), num_warps=1
    )
