"""Grammar bitmask applied to logits in place (matches reference.apply_token_bitmask_)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import is_interpreting, kernel


@kernel
def _bitmask_kernel(
    logits_ptr,  # (batch, vocab) float, row stride stride_l
    mask_ptr,  # (batch, num_words) int32, row stride stride_m
    idx_ptr,  # (num_rows,) int: rows to apply; unused unless HAS_INDICES
    stride_l,
    stride_m,
    vocab,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    if HAS_INDICES:
        row = tl.load(idx_ptr + tl.program_id(0)).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
    tok = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = tok < vocab
    words = tl.load(mask_ptr + row * stride_m + tok // 32, mask=inside, other=-1)
    banned = ((words >> (tok % 32)) & 1) == 0
    # only the banned logits are touched: no read of the logits at all
    tl.store(logits_ptr + row * stride_l + tok, float("-inf"), mask=inside & banned)


def apply_token_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """logits (batch, vocab) float, bitmask (batch, >= ceil(vocab / 32)) int32; bit j of word w allows
    token 32 * w + j. Disallowed logits become -inf in place. With `indices`, only those rows (of both
    logits and bitmask) are masked."""
    if logits.dim() != 2 or logits.stride(-1) != 1 or not logits.is_floating_point():
        raise ValueError("logits must be (batch, vocab) float with a contiguous last dim")
    b, vocab = logits.shape
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.stride(-1) != 1:
        raise ValueError("bitmask must be (batch, num_words) int32 with a contiguous last dim")
    if bitmask.shape[0] != b or bitmask.shape[1] * 32 < vocab:
        raise ValueError(f"bitmask {tuple(bitmask.shape)} does not cover logits {tuple(logits.shape)}")
    if indices is not None and (indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64)):
        raise ValueError("indices must be a 1-d int32/int64 tensor of row numbers")
    rows = b if indices is None else indices.shape[0]
    if rows == 0 or vocab == 0:
        return
    block = 1024 if is_interpreting(logits) else 4096
    _bitmask_kernel[(rows, triton.cdiv(vocab, block))](
        logits, bitmask, indices if indices is not None else bitmask, logits.stride(0), bitmask.stride(0),
        vocab, HAS_INDICES=indices is not None, BLOCK=block, num_warps=4,
    )  # fmt: skip
