"""RMSNorm and fused residual-add + RMSNorm (match reference.rms_norm / reference.fused_add_rms_norm)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import kernel, next_pow2


@triton.jit
def row_rstd(h_ptr, row, stride_h, hidden, eps, BLOCK_H: tl.constexpr):
    """1 / rms of row `row` of h (hidden values, row stride stride_h; BLOCK_H >= hidden), in float32: the
    scale of an RMSNorm whose weight is folded into the projection after it (reference.row_scaled)."""
    cols = tl.arange(0, BLOCK_H)
    h = tl.load(h_ptr + row.to(tl.int64) * stride_h + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    return 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / hidden + eps)


@kernel
def _rms_norm_kernel(
    x_ptr,  # (num_tokens, hidden), row stride stride_x
    res_ptr,  # (num_tokens, hidden) residual, row stride stride_r; unused unless HAS_RESIDUAL
    w_ptr,  # (hidden,)
    out_ptr,  # (num_tokens, hidden), row stride stride_o
    stride_x,
    stride_r,
    stride_o,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # rounded to the activation dtype like torch's `x + residual`
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    # as HF: normalize in fp32, round to the input dtype, then multiply by the weight
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be (num_tokens, hidden) with a contiguous last dim, got {tuple(x.shape)}")
    if weight.shape != (x.shape[1],) or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous ({x.shape[1]},), got {tuple(weight.shape)}")


def _num_warps(hidden: int) -> int:
    return 4 if hidden <= 2048 else 8


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x (num_tokens, hidden) -> new tensor of the same shape (dtype promoted with the weight's)."""
    _check(x, weight)
    n, hidden = x.shape
    if out is None:
        out = torch.empty((n, hidden), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if n:
        _rms_norm_kernel[(n,)](
            x, x, weight, out, x.stride(0), 0, out.stride(0), hidden, eps,
            HAS_RESIDUAL=False, BLOCK=next_pow2(hidden), num_warps=_num_warps(hidden),
        )  # fmt: skip
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """IN PLACE: residual <- x + residual, x <- rms_norm(residual); returns (x, residual).
    Both inputs are consumed: use the returned tensors. x and residual: (num_tokens, hidden), same dtype
    as the weight."""
    _check(x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
        raise ValueError("residual must match x in shape and dtype, with a contiguous last dim")
    if weight.dtype != x.dtype:
        raise ValueError("in-place fused_add_rms_norm needs weight.dtype == x.dtype")
    n, hidden = x.shape
    if n:
        _rms_norm_kernel[(n,)](
            x, residual, weight, x, x.stride(0), residual.stride(0), x.stride(0), hidden, eps,
            HAS_RESIDUAL=True, BLOCK=next_pow2(hidden), num_warps=_num_warps(hidden),
        )  # fmt: skip
    return x, residual
