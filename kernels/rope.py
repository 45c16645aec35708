"""Neox-style (rotate-half) rotary embedding, in place (matches reference.apply_rope).

Llama-3 frequency scaling and the attention scaling factor are folded into cos_sin by the caller
(reference.rope_cos_sin)."""

from __future__ import annotations

import torch
import triton.language as tl

from kernels._jit import kernel, next_pow2


@kernel
def _rope_kernel(
    q_ptr,  # (num_tokens, num_heads, head_dim), last dim contiguous
    k_ptr,  # (num_tokens, num_kv_heads, head_dim), last dim contiguous
    pos_ptr,  # (num_tokens,) int
    cs_ptr,  # (max_positions, head_dim) float32: [cos | sin]
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    jm = j < HALF
    cos = tl.load(cs_ptr + pos * (2 * HALF) + j, mask=jm, other=0.0)[None, :]  # (1, BLOCK_HALF)
    sin = tl.load(cs_ptr + pos * (2 * HALF) + HALF + j, mask=jm, other=0.0)[None, :]
    h = tl.arange(0, BLOCK_H)

    qm = (h[:, None] < NUM_HEADS) & jm[None, :]
    q1p = q_ptr + tok * stride_qt + h[:, None] * stride_qh + j[None, :]  # (BLOCK_H, BLOCK_HALF)
    q1 = tl.load(q1p, mask=qm, other=0.0).to(tl.float32)
    q2 = tl.load(q1p + HALF, mask=qm, other=0.0).to(tl.float32)
    tl.store(q1p, (q1 * cos - q2 * sin).to(q_ptr.dtype.element_ty), mask=qm)
    tl.store(q1p + HALF, (q2 * cos + q1 * sin).to(q_ptr.dtype.element_ty), mask=qm)

    km = (h[:, None] < NUM_KV_HEADS) & jm[None, :]
    k1p = k_ptr + tok * stride_kt + h[:, None] * stride_kh + j[None, :]
    k1 = tl.load(k1p, mask=km, other=0.0).to(tl.float32)
    k2 = tl.load(k1p + HALF, mask=km, other=0.0).to(tl.float32)
    tl.store(k1p, (k1 * cos - k2 * sin).to(k_ptr.dtype.element_ty), mask=km)
    tl.store(k1p + HALF, (k2 * cos + k1 * sin).to(k_ptr.dtype.element_ty), mask=km)


def apply_rope(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int32/int64
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32: [cos | sin]
) -> tuple[torch.Tensor, torch.Tensor]:
    """IN PLACE: rotates q and k (which may be strided views of a fused qkv output) and returns them."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)}: expected (n, h, d) and (n, hk, d)")
    n, h, d = q.shape
    if d % 2 or q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("head_dim must be even with a contiguous last dim")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != d or cos_sin.dtype != torch.float32:
        raise ValueError(f"cos_sin must be (max_positions, {d}) float32")
    if not cos_sin.is_contiguous():
        raise ValueError("cos_sin must be contiguous")
    if positions.shape != (n,):
        raise ValueError(f"positions must be ({n},)")
    if n:
        hk = k.shape[1]
        _rope_kernel[(n,)](
            q, k, positions, cos_sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            NUM_HEADS=h, NUM_KV_HEADS=hk, HALF=d // 2, BLOCK_H=next_pow2(max(h, hk)),
            BLOCK_HALF=next_pow2(d // 2),
        )  # fmt: skip
    return q, k
