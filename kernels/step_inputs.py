"""A captured decode step's first launch: it finishes the step's inputs on the device (matches
reference.decode_step_inputs), so that between the host's uploads and the forward nothing else runs.

The host packs a step of `rows` sequences into the graph's static buffers (engine.cuda_graphs):
  head (int64):   [ids (n) | positions (n) | slots (n) | k, rows, width, 0 | at (k) | src (k)]
  packed (int32): [lengths (n) | the rows' block tables, rows x width]
n is the largest captured batch. Program r copies row r of the packed tables into the graph's
(n, max_blocks) block table (r < rows); program 0 also writes the k tokens still in flight, the
previous step's sampled ids: ids[at[i]] = tokens[src[i]].
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernels._jit import kernel, next_pow2


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
):
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
        src_row = packed_ptr + n + r * width
        dst_row = table_ptr + r * max_blocks
        for j in range(0, width, BLOCK_W):
            c = j + tl.arange(0, BLOCK_W)
            inside = c < width
            tl.store(dst_row + c, tl.load(src_row + c, mask=inside), mask=inside)


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
        head, packed, table, tokens, n, max_blocks, BLOCK_K=next_pow2(n), BLOCK_W=128, num_warps=1
    )
