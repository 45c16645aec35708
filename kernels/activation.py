"""SiLU(gate) * up over a fused gate_up projection (matches reference.silu_and_mul)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import is_interpreting, kernel, next_pow2


@kernel
def _silu_and_mul_kernel(
    x_ptr,  # (num_tokens, 2 * inter), row stride stride_x
    out_ptr,  # (num_tokens, inter), row stride stride_o
    stride_x,
    stride_o,
    inter,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    # F.silu rounds to the activation dtype before the multiply
    s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (s * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (num_tokens, 2 * inter) -> (num_tokens, inter) new tensor (or `out`)."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be (num_tokens, 2 * inter), last dim contiguous, got {tuple(x.shape)}")
    n, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((n, inter), dtype=x.dtype, device=x.device)
    elif out.shape != (n, inter) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError("out must be (num_tokens, inter) of x's dtype")
    if n:
        block = min(next_pow2(inter), 256 if is_interpreting(x) else 1024)
        _silu_and_mul_kernel[(n, triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4
        )
    return out
