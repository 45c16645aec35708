"""Fused pre-attention step: per-head q/k RMSNorm (Qwen3), RoPE and the K/V cache write, one launch
instead of four (matches reference.qk_norm_rope_store_kv). Decode steps are launch-bound, so this is
28 layers x 3 launches fewer per step for Qwen3."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import kernel, next_pow2


@kernel
def _qk_norm_rope_store_kernel(
    q_ptr,  # (num_tokens, num_heads, head_dim), last dim contiguous; rotated in place
    k_ptr,  # (num_tokens, num_kv_heads, head_dim), last dim contiguous; rotated in place
    v_ptr,  # (num_tokens, num_kv_heads, head_dim), last dim contiguous
    qw_ptr,  # (head_dim,) q norm weight; unused unless HAS_NORM
    kw_ptr,  # (head_dim,)
    pos_ptr,  # (num_tokens,) int
    cs_ptr,  # (max_positions, head_dim) float32: [cos | sin]
    k_cache_ptr,  # (num_slots, num_kv_heads, head_dim) contiguous
    v_cache_ptr,
    slot_ptr,  # (num_tokens,) int; < 0 = padding
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    jm = j < HALF
    cos = tl.load(cs_ptr + pos * (2 * HALF) + j, mask=jm, other=0.0)[None, :]  # (1, BLOCK_HALF)
    sin = tl.load(cs_ptr + pos * (2 * HALF) + HALF + j, mask=jm, other=0.0)[None, :]
    h = tl.arange(0, BLOCK_H)

    # ---- q, then k: norm over each head's full head_dim (two halves), round like torch, rotate
    qm = (h[:, None] < NUM_HEADS) & jm[None, :]
    q1p = q_ptr + tok * stride_qt + h[:, None] * stride_qh + j[None, :]  # (BLOCK_H, BLOCK_HALF)
    _norm_rotate(q1p, qm, qw_ptr, j, jm, cos, sin, eps, HALF, HAS_NORM)
    km = (h[:, None] < NUM_KV_HEADS) & jm[None, :]
    k1p = k_ptr + tok * stride_kt + h[:, None] * stride_kh + j[None, :]
    r1, r2 = _norm_rotate(k1p, km, kw_ptr, j, jm, cos, sin, eps, HALF, HAS_NORM)
    # ---- k and v into the cache slot
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        dst = slot * (NUM_KV_HEADS * 2 * HALF) + h[:, None] * (2 * HALF) + j[None, :]  # (BLOCK_H, BLOCK_HALF)
        ct = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + dst, r1.to(ct), mask=km)
        tl.store(k_cache_ptr + dst + HALF, r2.to(ct), mask=km)
        v1p = v_ptr + tok * stride_vt + h[:, None] * stride_vh + j[None, :]
        tl.store(v_cache_ptr + dst, tl.load(v1p, mask=km).to(ct), mask=km)
        tl.store(v_cache_ptr + dst + HALF, tl.load(v1p + HALF, mask=km).to(ct), mask=km)


@triton.jit
def _norm_rotate(x1p, mask, w_ptr, j, jm, cos, sin, eps, HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """Heads at x1p (first halves; second halves HALF further), in place: optional RMSNorm (rounded
    like torch), then RoPE. Returns the rotated halves in the tensor's dtype. (A helper: interpreted
    or compiled with its caller, see kernels._jit.)"""
    dt = x1p.dtype.element_ty
    x1 = tl.load(x1p, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x1p + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + j, mask=jm, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j, mask=jm, other=0.0).to(tl.float32)[None, :]
        x1 = (w1 * (x1 * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        x2 = (w2 * (x2 * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    r1 = (x1 * cos - x2 * sin).to(dt)
    r2 = (x2 * cos + x1 * sin).to(dt)
    tl.store(x1p, r1, mask=mask)
    tl.store(x1p + HALF, r2, mask=mask)
    return r1, r2


def check_new_token_args(
    dtype: torch.dtype,  # q's
    n: int,  # tokens
    num_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """ValueError unless the new tokens' norm weights, rotary table, cache and slots fit (this launch's
    and kernels.qkv_new_token's)."""
    d = head_dim
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight go together")
    if q_norm_weight is not None:
        for w in (q_norm_weight, k_norm_weight):
            if w.shape != (d,) or not w.is_contiguous() or w.dtype != dtype:
                raise ValueError(f"norm weights must be contiguous ({d},) of q's dtype")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != d or cos_sin.dtype != torch.float32:
        raise ValueError(f"cos_sin must be (max_positions, {d}) float32")
    if not cos_sin.is_contiguous():
        raise ValueError("cos_sin must be contiguous")
    if k_cache.dim() != 4 or k_cache.shape[2:] != (num_kv_heads, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit {num_kv_heads} KV heads of {d}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if positions.shape != (n,) or slot_mapping.shape != (n,):
        raise ValueError(f"positions and slot_mapping must be ({n},)")


def qk_norm_rope_store_kv(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    q_norm_weight: torch.Tensor | None,  # (head_dim,) or None (no q/k norm)
    k_norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int; < 0 = padding
) -> tuple[torch.Tensor, torch.Tensor]:
    """IN PLACE on q and k (strided views of the qkv output are fine); returns (q, k)."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[::2] != k.shape[::2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit")
    n, h, d = q.shape
    hk = k.shape[1]
    if d % 2 or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("head_dim must be even, q/k/v with a contiguous last dim")
    if k.dtype != q.dtype:
        raise ValueError("q and k must share a dtype")
    norms = (q_norm_weight, k_norm_weight)
    check_new_token_args(q.dtype, n, hk, d, *norms, positions, cos_sin, k_cache, v_cache, slot_mapping)
    if n:
        has_norm = q_norm_weight is not None
        _qk_norm_rope_store_kernel[(n,)](
            q, k, v, q_norm_weight if has_norm else cos_sin, k_norm_weight if has_norm else cos_sin,
            positions, cos_sin, k_cache, v_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), eps,
            NUM_HEADS=h, NUM_KV_HEADS=hk, HALF=d // 2, BLOCK_H=next_pow2(max(h, hk)),
            BLOCK_HALF=next_pow2(d // 2), HAS_NORM=has_norm,
        )  # fmt: skip
    return q, k
