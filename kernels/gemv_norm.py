"""The norm fused into a decode projection: kernels.gemv's fma kernel with NORM (and GATHER).

`add_rms_norm_gemv`: (rms_norm(x + residual) @ W^T + bias, x + residual) in one launch; a first
layer's `embed_rms_norm_gemv` also gathers its rows of x from the embedding by token id. The kernel and
its rounding are kernels.gemv's (see its docstring); here the checks, tiles and launches.
"""

from __future__ import annotations

import torch
import triton

from kernels import pdl
from kernels._jit import is_interpreting, next_pow2
from kernels.gemv import GemvConfig, _checked_out, _config, _gemv_fma_kernel, gemv

NORM_TILE = 2048  # elements of x (+ residual) per step of the sum-of-squares pass, all rows together


def add_rms_norm_gemv(
    x: torch.Tensor,  # (M, K)
    residual: torch.Tensor | None,  # (M, K), same dtype as x; None: normalize x alone
    norm_weight: torch.Tensor,  # (K,) contiguous, same dtype as x
    eps: float,
    weight: torch.Tensor,  # (N, K), same dtype as x
    bias: torch.Tensor | None = None,  # (N,)
    config: GemvConfig | None = None,
    out: torch.Tensor | None = None,  # (M, N) of x's dtype
) -> tuple[torch.Tensor, torch.Tensor]:  # y (M, N), new residual (M, K)
    """(rms_norm(x + residual) @ W^T + bias, x + residual), as reference.add_rms_norm_linear; residual
    None: (rms_norm(x) @ W^T + bias, x). One launch on the fma path; the inputs are never modified (the
    new residual is a new tensor). Other paths run the norm, then `gemv`."""
    out = _checked_out(x, weight, bias, out, weight.shape[-1])
    m, k = x.shape
    n = weight.shape[0]
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1
    ):
        raise ValueError("residual must match x in shape and dtype, with a contiguous last dim")
    _check_norm_weight(norm_weight, x.dtype, k)
    cfg = _config(x, n, k, config)
    if cfg.path != "fma" or m == 0 or n == 0 or k == 0:
        from kernels.rmsnorm import rms_norm

        new_residual = x if residual is None else x + residual
        return gemv(rms_norm(new_residual, norm_weight, eps), weight, bias, config, out), new_residual
    new_residual = x if residual is None else torch.empty((m, k), dtype=x.dtype, device=x.device)
    _norm_launch(x, None, residual, norm_weight, eps, weight, bias, cfg, out, new_residual, config is None)
    return out, new_residual


def _check_norm_weight(norm_weight: torch.Tensor, dtype: torch.dtype, k: int) -> None:
    if norm_weight.shape != (k,) or norm_weight.dtype != dtype or not norm_weight.is_contiguous():
        raise ValueError(
            f"norm_weight must be contiguous ({k},) of x's dtype, got {tuple(norm_weight.shape)}"
        )


def _norm_launch(x, ids, residual, norm_weight, eps, weight, bias, cfg, out, new_residual, default_cfg,
                 pdl_on=False, preload=False) -> None:  # fmt: skip
    """The fma kernel with NORM: x (M, K), or with ids the embedding table whose rows ids[r] are x."""
    m, (n, k) = out.shape[0], weight.shape
    block_m = next_pow2(m)
    norm_block = min(next_pow2(k), max(cfg.block_k, NORM_TILE // block_m))
    if is_interpreting(x) and default_cfg:
        norm_block = min(norm_block, 64)
    r = residual if residual is not None else x  # a dummy pointer when HAS_RESIDUAL is off
    _gemv_fma_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, weight, bias if bias is not None else weight, out, r, norm_weight, new_residual,
        ids if ids is not None else x, m, n, k, x.stride(0), weight.stride(0), out.stride(0), r.stride(0),
        eps,
        HAS_BIAS=bias is not None, EVEN=n % cfg.block_n == 0 and k % cfg.block_k == 0, SILU_MUL=False,
        NORM=True, HAS_RESIDUAL=residual is not None, NORM_BLOCK=norm_block, GATHER=ids is not None,
        PDL=pdl_on, PRELOAD=preload, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch_kwargs(pdl_on),
    )  # fmt: skip


PRELOAD_MAX_K = 2048  # a program's whole weight slice in registers before its PDL wait


def embed_rms_norm_gemv(
    ids: torch.Tensor,  # (M,) int64 token ids
    table: torch.Tensor,  # (V, K): the embedding
    norm_weight: torch.Tensor,  # (K,) contiguous, same dtype as table
    eps: float,
    weight: torch.Tensor,  # (N, K), same dtype as table
    bias: torch.Tensor | None = None,  # (N,)
    config: GemvConfig | None = None,
    out: torch.Tensor | None = None,  # (M, N) of table's dtype
    pdl_on: bool = False,  # programmatic dependent launch: the ids come from the kernel before
    preload: bool | None = None,  # weights read before the wait (default: with pdl_on, where it fits)
) -> tuple[torch.Tensor, torch.Tensor]:  # y (M, N), the embedding rows (M, K): the residual stream
    """A first layer's input projection (rms_norm(table[ids]) @ W^T + bias, table[ids]), as
    reference.embedding then reference.add_rms_norm_linear without a residual. On the fma path one
    launch gathers the rows itself; with pdl_on it may start while the kernel before (the step's inputs)
    runs, its weights asked for before it waits."""
    if ids.dim() != 1 or ids.dtype != torch.int64 or ids.device != table.device:
        raise ValueError("ids must be (M,) int64 on the table's device")
    if table.dim() != 2 or table.stride(-1) != 1:
        raise ValueError(f"table must be (V, K) with a contiguous last dim, got {tuple(table.shape)}")
    m, k = ids.shape[0], table.shape[1]
    rows = table[:1].expand(m, k)  # x's shape for the checks and the config, no copy
    out = _checked_out(rows, weight, bias, out, k)
    n = weight.shape[0]
    _check_norm_weight(norm_weight, table.dtype, k)
    cfg = _config(rows, n, k, config)
    if cfg.path != "fma" or m == 0 or n == 0 or k == 0:
        x = table.index_select(0, ids)
        return add_rms_norm_gemv(x, None, norm_weight, eps, weight, bias, config, out)
    one_chunk = n % cfg.block_n == 0 and k == next_pow2(k)  # the slice loads unmasked, in one piece
    if preload is None:
        preload = pdl_on and one_chunk and k <= PRELOAD_MAX_K
    elif preload and not one_chunk:
        raise ValueError("preload needs N a multiple of the block and K a power of two")
    if preload:
        cfg = cfg._replace(block_k=k)
    new_residual = torch.empty((m, k), dtype=table.dtype, device=table.device)
    _norm_launch(table, ids, None, norm_weight, eps, weight, bias, cfg, out, new_residual, config is None,
                 pdl_on, preload)  # fmt: skip
    return out, new_residual
