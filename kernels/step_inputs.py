"""A captured decode step's first launch: it finishes the step's inputs on the device (matches
reference.decode_step_inputs), so that between the host's uploads and the forward nothing else runs.

The host packs a step of `rows` sequences into the graph's static buffers (runner.cuda_graphs):
  head (int64):   [ids (n) | positions (n) | slots (n) | k, rows, width, 0 | at (k) | src (k)]
  packed (int32): [lengths (n) | the rows' block tables, rows x width]
n is the largest captured batch. Program r copies row r of the packed tables into the graph's
(n, max_blocks) block table (r < rows); program 0 also writes the k tokens still in flight, the
previous step's sampled ids: ids[at[i]] = tokens[src[i]].

A step graph (runner.cuda_graphs.DecodeGraphs) skips the uploads: the host writes the step into a row
of a pinned ring, [ids | positions | slots | src (n each; src = the row of an in-flight id in tokens,
else -1) | rows, width, 0, 0] (int64) and [lengths (n) | tables, row r at n + r * max_blocks] (int32),
and `mapped_step_inputs` reads it over PCIe, the row named by a device counter that the graph's last
launch advances (kernels.publish). Each read over PCIe costs a round trip, so a program asks for its
whole row at once: its table row's first BLOCK_W entries sit at a fixed place and are asked for
beside the width that says how many of them to keep.

Both let the next launch start at once (kernels.pdl): at batch 1 that is the first layer's projection
(kernels.dispatch.embed_rms_norm_linear), which reads its weights while this launch runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import kernel, next_pow2


@triton.jit
def _copy_row(src, dst, width, BLOCK_W: tl.constexpr):
    """A block-table row of `width` entries, BLOCK_W at a time."""
    for j in range(0, width, BLOCK_W):
        c = j + tl.arange(0, BLOCK_W)
        inside = c < width
        tl.store(dst + c, tl.load(src + c, mask=inside), mask=inside)


@kernel
def _step_inputs_kernel(
    head_ptr,  # (5n + 4,) int64, the layout above
    packed_ptr,  # (n + rows * width,) int32
    table_ptr,  # (n, max_blocks) int32, contiguous
    tokens_ptr,  # (>= max(src) + 1,) int64
    n,
    max_blocks,
    BLOCK_K: tl.constexpr,  # >= n
    BLOCK_W: tl.constexpr,
    RELEASE: tl.constexpr,  # let the next launch (with programmatic dependent launch) start at once
):
    pdl.release(RELEASE)
    r = tl.program_id(0)
    control = head_ptr + 3 * n  # k, rows, width, unused; then the k pairs
    k = tl.load(control)
    if r == 0:
        i = tl.arange(0, BLOCK_K)
        live = i < k
        at = tl.load(control + 4 + i, mask=live, other=0)
        src = tl.load(control + 4 + k + i, mask=live, other=0)
        tl.store(head_ptr + at, tl.load(tokens_ptr + src, mask=live), mask=live)
    if r < tl.load(control + 1):
        width = tl.load(control + 2)
        _copy_row(packed_ptr + n + r * width, table_ptr + r * max_blocks, width, BLOCK_W)


def decode_step_inputs(
    head: torch.Tensor,  # (5n + 4,) int64
    packed: torch.Tensor,  # (n + n * max_blocks,) int32
    table: torch.Tensor,  # (n, max_blocks) int32
    tokens: torch.Tensor,  # (n,) int64
    size: int,  # the captured batch: programs launched (rows <= size)
) -> None:
    n, max_blocks = table.shape
    if head.dtype != torch.int64 or head.shape != (5 * n + 4,):
        raise ValueError(f"head must be ({5 * n + 4},) int64, got {tuple(head.shape)} {head.dtype}")
    if packed.dtype != torch.int32 or packed.numel() < n or table.dtype != torch.int32:
        raise ValueError("packed and table must be int32")
    if not table.is_contiguous() or tokens.dtype != torch.int64:
        raise ValueError("table must be contiguous and tokens int64")
    _step_inputs_kernel[(size,)](
        head, packed, table, tokens, n, max_blocks, BLOCK_K=next_pow2(n), BLOCK_W=128,
        RELEASE=pdl.enabled(head.device), num_warps=1,
    )  # fmt: skip


@kernel
def _mapped_inputs_kernel(
    host64_ptr,  # (slots, 4n + 4) int64 pinned: [ids | positions | slots | src | rows, width, 0, 0]
    host32_ptr,  # (slots, n + n * max_blocks) int32 pinned: [lengths | the tables, (n, max_blocks)]
    counter_ptr,  # (1,) int64 on the device: the ring row of this launch is counter % slots
    head_ptr,  # (3n + ...) int64 on the device: [ids | positions | slots]
    lens_ptr,  # (n,) int32 on the device
    table_ptr,  # (n, max_blocks) int32, contiguous
    tokens_ptr,  # (n,) int64: the previous step's sampled ids
    n,
    max_blocks,
    stride64,
    stride32,
    SLOTS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    RELEASE: tl.constexpr,  # let the next launch (with programmatic dependent launch) start at once
):
    pdl.release(RELEASE)
    r = tl.program_id(0)
    at = tl.load(counter_ptr) % SLOTS
    h64 = host64_ptr + at * stride64
    h32 = host32_ptr + at * stride32
    src = tl.load(h64 + 3 * n + r)
    tok = tl.load(h64 + r)
    if src >= 0:  # still in flight: the previous step's draw
        tok = tl.load(tokens_ptr + src)
    tl.store(head_ptr + r, tok)
    tl.store(head_ptr + n + r, tl.load(h64 + n + r))
    tl.store(head_ptr + 2 * n + r, tl.load(h64 + 2 * n + r))
    tl.store(lens_ptr + r, tl.load(h32 + r))
    c = tl.arange(0, BLOCK_W)
    src_row, dst_row = h32 + n + r * max_blocks, table_ptr + r * max_blocks
    first = tl.load(src_row + c, mask=c < max_blocks)  # asked for with the width, not after it
    width = tl.where(r < tl.load(h64 + 4 * n), tl.load(h64 + 4 * n + 1), 0)  # rows past the step: none
    tl.store(dst_row + c, first, mask=c < width)
    if width > BLOCK_W:
        _copy_row(src_row + BLOCK_W, dst_row + BLOCK_W, width - BLOCK_W, BLOCK_W)


def mapped_step_inputs(
    host64: torch.Tensor,  # (slots, 4n + 4) int64, pinned on CUDA
    host32: torch.Tensor,  # (slots, n + n * max_blocks) int32, pinned on CUDA
    counter: torch.Tensor,  # (1,) int64 on the device
    head: torch.Tensor,  # (>= 3n,) int64 on the device
    lens: torch.Tensor,  # (n,) int32 on the device
    table: torch.Tensor,  # (n, max_blocks) int32
    tokens: torch.Tensor,  # (n,) int64
    size: int,  # the captured batch: rows 0..size-1 are written
) -> None:
    """A step graph's first launch when the host writes the step straight into pinned memory (matches
    reference.mapped_step_inputs): row r of the ids, positions, slots and lengths (the id from
    `tokens` where the host marked it in flight) and, for r < rows, its block-table row."""
    from kernels.publish import Mapped

    n, max_blocks = table.shape
    if host64.shape[1:] != (4 * n + 4,) or host32.shape[1:] != (n + n * max_blocks,):
        raise ValueError(
            f"host rings must be (slots, {4 * n + 4}) int64 and (slots, {n + n * max_blocks}) int32"
        )
    if host64.shape[0] != host32.shape[0] or not (host64.is_contiguous() and host32.is_contiguous()):
        raise ValueError("host rings must be contiguous, with as many rows each")
    on_gpu = head.device.type == "cuda"
    h64, h32 = (Mapped(host64), Mapped(host32)) if on_gpu else (host64, host32)
    _mapped_inputs_kernel[(size,)](
        h64, h32, counter, head, lens, table, tokens, n, max_blocks, host64.stride(0), host32.stride(0),
        SLOTS=host64.shape[0], BLOCK_W=128, RELEASE=pdl.enabled(head.device), num_warps=1,
    )  # fmt: skip
