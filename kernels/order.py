"""The decode rows longest first (kernels.decode_attention's `order`) in one launch.

Each row's place is its rank: the rows longer than it, plus the rows as long with a lower index (so
ties keep index order, as reference.longest_first). Programs of BLOCK_I rows count over the batch in
BLOCK_J chunks and scatter their rows to their places: O(batch^2) comparisons in one launch, where a
device argsort takes a sort and four small launches (`python -m bench.kernels --only order` times both).
CUDA-graph safe: no host sync, no allocation beyond the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import kernel

BLOCK_I = 64
BLOCK_J = 64


@kernel
def _rank_kernel(
    lens_ptr,  # (batch,) int32
    order_ptr,  # (batch,) int32: order[rank of row i] = i
    batch,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = i < batch
    li = tl.load(lens_ptr + i, mask=i_mask, other=0)
    rank = tl.zeros((BLOCK_I,), dtype=tl.int32)
    for j0 in range(0, batch, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        lj = tl.load(lens_ptr + j, mask=j < batch, other=0)
        ahead = (lj[None, :] > li[:, None]) | ((lj[None, :] == li[:, None]) & (j[None, :] < i[:, None]))
        ahead = ahead & (j < batch)[None, :]
        rank += tl.sum(ahead.to(tl.int32), axis=1)
    tl.store(order_ptr + rank, i, mask=i_mask)


def longest_first(seq_lens: torch.Tensor) -> torch.Tensor:  # (batch,) int32
    """The rows of seq_lens ((batch,) int32) by descending length, ties by index."""
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be (batch,) int32, got {tuple(seq_lens.shape)} {seq_lens.dtype}")
    batch = seq_lens.shape[0]
    order = torch.empty((batch,), dtype=torch.int32, device=seq_lens.device)
    if batch:
        _rank_kernel[(triton.cdiv(batch, BLOCK_I),)](
            seq_lens.contiguous(), order, batch, BLOCK_I=BLOCK_I, BLOCK_J=BLOCK_J, num_warps=4
        )
    return order
