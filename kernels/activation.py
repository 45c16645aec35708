"""SiLU(gate) * up over a fused gate_up projection (matches reference.silu_and_mul); with a row scale, of
a gate_up projection that read the residual stream un-normalized (reference.row_scaled first)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import is_interpreting, kernel, next_pow2
from kernels.rmsnorm import row_rstd


@kernel
def _silu_and_mul_kernel(
    x_ptr,  # (num_tokens, 2 * inter), row stride stride_x
    out_ptr,  # (num_tokens, inter), row stride stride_o
    h_ptr,  # ROW_SCALE: (num_tokens, hidden), row stride stride_h
    stride_x,
    stride_o,
    stride_h,
    inter,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    ROW_SCALE: tl.constexpr,  # gate and up times 1 / rms(h's row) first, rounded (reference.row_scaled)
    BLOCK_H: tl.constexpr,  # >= hidden (ROW_SCALE)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if ROW_SCALE:
        dt = x_ptr.dtype.element_ty
        rs = row_rstd(h_ptr, row, stride_h, hidden, eps, BLOCK_H)
        g = (g * rs).to(dt).to(tl.float32)
        u = (u * rs).to(dt).to(tl.float32)
    # F.silu rounds to the activation dtype before the multiply
    s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (s * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    row_scale: tuple[torch.Tensor, float] | None = None,  # (h (num_tokens, hidden), eps)
) -> torch.Tensor:
    """x (num_tokens, 2 * inter) -> (num_tokens, inter) new tensor (or `out`); with row_scale, of
    reference.row_scaled(x, h, eps)."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be (num_tokens, 2 * inter), last dim contiguous, got {tuple(x.shape)}")
    n, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((n, inter), dtype=x.dtype, device=x.device)
    elif out.shape != (n, inter) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError("out must be (num_tokens, inter) of x's dtype")
    h, eps = row_scale if row_scale is not None else (x, 0.0)
    if row_scale is not None and (h.dim() != 2 or h.shape[0] != n or h.stride(-1) != 1):
        raise ValueError(f"row_scale's h must be ({n}, hidden), last dim contiguous, got {tuple(h.shape)}")
    if n:
        block = min(next_pow2(inter), 256 if is_interpreting(x) else 1024)
        _silu_and_mul_kernel[(n, triton.cdiv(inter, block))](
            x, out, h, x.stride(0), out.stride(0), h.stride(0), inter, h.shape[1], eps,
            BLOCK=block, ROW_SCALE=row_scale is not None, BLOCK_H=next_pow2(h.shape[1]) if row_scale else 1,
            num_warps=4,
        )  # fmt: skip
    return out
