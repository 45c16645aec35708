"""kernels.dispatch's row-wise ops: RMSNorm (with the residual add), RoPE, SiLU-and-mul and the grammar
bitmask (in place on CUDA where kernels.dispatch's docstring says so)."""

from __future__ import annotations

import torch

from kernels import reference as ref
from kernels.backend import use_triton


def _cpu_float32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Float32 on the CPU, where torch's rms_norm gives reference.rms_norm's values in one call."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: (..., hidden)
    if _cpu_float32(x, weight):  # one call, the reference's values
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    if not use_triton(x) or x.stride(-1) != 1:
        return ref.rms_norm(x, weight, eps)
    from kernels.rmsnorm import rms_norm as triton_rms_norm

    return triton_rms_norm(x.reshape(-1, x.shape[-1]), weight.contiguous(), eps).view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual); IN PLACE on CUDA (inputs consumed)."""
    if _cpu_float32(x, weight) and residual.dtype == x.dtype:
        residual = x + residual
        return torch.nn.functional.rms_norm(residual, (x.shape[-1],), weight, eps), residual
    if (
        not use_triton(x)
        or x.dim() != 2
        or weight.dtype != x.dtype
        or residual.dtype != x.dtype
        or x.stride(-1) != 1
        or residual.stride(-1) != 1
    ):
        return ref.fused_add_rms_norm(x, residual, weight, eps)
    from kernels.rmsnorm import fused_add_rms_norm as triton_fused

    return triton_fused(x, residual, weight.contiguous(), eps)


def apply_rope(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns rotated (q, k); IN PLACE on CUDA (inputs consumed)."""
    if not use_triton(q):
        return ref.apply_rope(q, k, positions, cos_sin)
    from kernels.rope import apply_rope as triton_rope

    return triton_rope(q, k, positions, cos_sin.contiguous())


def silu_and_mul(x: torch.Tensor, row_scale: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """x: (..., 2 * intermediate) -> (..., intermediate); with row_scale (h (tokens, hidden), eps), of
    reference.row_scaled(x, h, eps) (x: (tokens, 2 * intermediate))."""
    if not use_triton(x) or x.stride(-1) != 1:
        if row_scale is not None:
            x = ref.row_scaled(x, *row_scale)
        return ref.silu_and_mul(x)
    from kernels.activation import silu_and_mul as triton_silu_and_mul

    scale = (row_scale[0].contiguous(), row_scale[1]) if row_scale is not None else None
    out = triton_silu_and_mul(x.reshape(-1, x.shape[-1]), row_scale=scale)
    return out.view(*x.shape[:-1], x.shape[-1] // 2)


def apply_token_bitmask_(
    logits: torch.Tensor,  # (batch, vocab) float
    bitmask: torch.Tensor,  # (batch, >= ceil(vocab / 32)) int32
    indices: torch.Tensor | None = None,  # (num_rows,) int: rows of logits and bitmask to apply
) -> None:
    if use_triton(logits):
        from kernels.bitmask import apply_token_bitmask_ as triton_apply

        triton_apply(logits, bitmask, indices)
        return
    if indices is None:
        ref.apply_token_bitmask_(logits, bitmask)
        return
    rows = indices.long()
    sub = logits[rows]
    ref.apply_token_bitmask_(sub, bitmask[rows])
    logits[rows] = sub
