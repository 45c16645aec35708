"""Write new K/V rows into the paged cache (matches reference.store_kv)."""

from __future__ import annotations

import torch
import triton.language as tl

from kernels._jit import kernel, next_pow2


@kernel
def _store_kv_kernel(
    k_ptr,  # (num_tokens, num_kv_heads, head_dim), last dim contiguous
    v_ptr,
    k_cache_ptr,  # (num_slots, num_kv_heads, head_dim) contiguous
    v_cache_ptr,
    slot_ptr,  # (num_tokens,) int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    src_k = k_ptr + tok.to(tl.int64) * stride_kt + h[:, None] * stride_kh + d[None, :]
    src_v = v_ptr + tok.to(tl.int64) * stride_vt + h[:, None] * stride_vh + d[None, :]
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + h[:, None] * HEAD_DIM + d[None, :]  # (BLOCK_H, BLOCK_D)
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int32/int64; < 0 = padding, not written
) -> None:
    """One program per token copies all its KV heads; padding slots (< 0) are skipped on the device,
    so a fixed-size (CUDA-graph) batch can carry padding tokens."""
    n, hk, d = k.shape
    if v.shape != k.shape:
        raise ValueError(f"v shape {tuple(v.shape)} != k shape {tuple(k.shape)}")
    if k_cache.dim() != 4 or k_cache.shape[2:] != (hk, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit k {tuple(k.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k and v need a contiguous last dim")
    if slot_mapping.shape != (n,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError("slot_mapping must be (num_tokens,) int32/int64")
    if n == 0:
        return
    _store_kv_kernel[(n,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_KV_HEADS=hk, HEAD_DIM=d, BLOCK_H=next_pow2(hk), BLOCK_D=next_pow2(d),
    )  # fmt: skip
