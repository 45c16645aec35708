"""Programmatic dependent launch (Hopper and later) between the batch-1 decode launches, and between a
wide decode step's qkv projection and its attention.

A kernel launched with `launch_pdl` may start while the kernel before it in the stream is still
running, once every program of that one has executed `griddepcontrol.launch_dependents` (or exited).
Its programs then run what does not depend on the previous kernel (weights, block tables, the step's
host inputs) and block at `griddepcontrol.wait` until the previous kernel has finished and its writes
are visible. At batch 1 a layer is two launches (the fused decode attention and the layer tail), each
latency-bound: the next launch's start and its first weight requests overlap the end of the one before
(the attention's split merge on a few SMs, the tail's last stage).

In a wide folded decode step (kernels.dispatch_linear.QKV_EPILOGUE_MIN_M rows or more) the qkv projection
with the new token's work (kernels.qkv_new_token) releases its successor at its start, and the decode
attention after it reads its sequence's length, order entry and block-table row while the projection
runs, then waits for q and the new K/V. The rows' order is sorted before the projection
(models.attention.projected_decode_attention), so nothing runs between the two.

Rules every user follows: a kernel launched with `launch_kwargs(True)` waits (`wait`; in the Gluon
tail, kernels.decode_tail_tma's `_gdc`) before it reads anything an earlier kernel of the step wrote,
with one exception: the step's inputs (lengths, positions, block tables, written by the graph's input
launch, kernels.step_inputs, and the rows' order sorted from them), which the decode attention reads
before its wait. So the first launch after the input launch releases its successor only after its own
wait (kernels.gemv's head): every later launch starts once the inputs are written. A kernel whose
successor reads nothing early may call `release` anywhere, since a successor launched without the
attribute still starts only once it has finished.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from kernels import _jit

# Module switch (documented in docs/switches.md): False launches every kernel without programmatic
# dependent launch, the same bits in more time; for debugging a GPU hang or bisecting a wrong result
PDL = True


@functools.cache
def _supported_by_triton() -> bool:
    from triton.backends.nvidia.compiler import CUDAOptions

    return any(f.name == "launch_pdl" for f in dataclasses.fields(CUDAOptions))


@functools.cache
def _capable(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether launches on device use programmatic dependent launch (CUDA, sm_90+, a Triton with it).
    Inside kernels._jit.record_launches (compiling for sm_90 without a GPU) as on the H200."""
    if not PDL or not _supported_by_triton():
        return False
    if device.type != "cuda":
        return _jit.recording()
    return _capable(device.index)


def launch_kwargs(on: bool) -> dict:
    return {"launch_pdl": True} if on else {}


@triton.jit
def wait(ON: tl.constexpr):
    """Blocks until the previous kernel in the stream has finished and its writes are visible."""
    if ON:
        tl.inline_asm_elementwise(
            "griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def release(ON: tl.constexpr):
    """Lets the next kernel (launched with launch_pdl) start once every program has passed here."""
    if ON:
        tl.inline_asm_elementwise(
            "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )
