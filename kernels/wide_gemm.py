"""The folded layer tail of a wide decode step (kernels.dispatch.folded_decode_layer_tail) as four Triton
GEMM launches chained by programmatic dependent launch (kernels.pdl).

With the RMSNorm weights folded into the projections, each projection of the tail is a plain GEMM whose
epilogue does the elementwise work between them:

    residual += a @ Wo^T             RESIDUAL: one rounding of (acc + residual), as addmm_; SQ_OUT:
                                     each tile's partial sums of squares of the new residual rows
    act = silu(g) * u                SILU: [g | u] = residual @ Wgu^T, times 1 / rms of the residual row
                                     (from o's partial sums), rounded as silu_and_mul(row_scale=...)
    residual += act @ Wd^T           RESIDUAL
    qkv = residual @ Wqkv'^T         plain; the decode attention applies 1 / rms (its row_scale)

so a layer is four launches, no SiLU launch. Every launch starts while the one before runs: its programs
ask for their weight rows into L2 (PREFETCH: one bulk prefetch per row slice) and then wait
(griddepcontrol.wait) for the launch before, whose output they read; they release their successor once
past the wait, so at most one launch waits ahead of the running one.

A tile's K range may be cut in SPLIT_K slices (more programs where the output tiles alone leave SMs idle):
each slice stores its float32 partial products and the program that ends a tile's last slice (an arrival
counter per tile, left zeroed) sums them in slice order and runs the epilogue (deterministic).

`python -m kernels.bench_wide` times the chain against the cuBLAS path over 28 layers' weights and sweeps
the tiles.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import arrival_counters, is_interpreting, kernel, next_pow2


class WideConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1


@triton.jit
def _l2_prefetch(ptrs, nbytes):
    """One bulk L2 prefetch of nbytes (a multiple of 16, 16-byte aligned) at each pointer of ptrs."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
        "=r,l,r",
        [ptrs, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _epilogue(acc, acc_up, rm, rn, mask_m, mask_n, pid_n, y_ptr, sq_in_ptr, sq_out_ptr, M, N_OUT, P_IN,
              stride_y, eps, K, SILU: tl.constexpr, RESIDUAL: tl.constexpr, SQ_OUT: tl.constexpr,
              P_BLOCK: tl.constexpr):  # fmt: skip
    """RESIDUAL (y += acc, SQ_OUT), SILU (row-scaled silu(gate) * up) or a plain store of the tile."""
    dt = y_ptr.dtype.element_ty
    mask = mask_m[:, None] & mask_n[None, :]
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_y + rn[None, :]
    if RESIDUAL:  # addmm_: the product and the residual summed in float32, rounded once
        r = tl.load(y_ptrs, mask=mask, other=0.0)
        out = (acc + r.to(tl.float32)).to(dt)
        if SQ_OUT:  # masked columns hold zeros
            of = out.to(tl.float32)
            tl.store(sq_out_ptr + pid_n * M + rm, tl.sum(of * of, axis=1), mask=mask_m)
    elif SILU:  # the gate_up product rounded, times 1 / rms of the input row rounded, then silu_and_mul
        rp = tl.arange(0, P_BLOCK)
        p_mask = (rp < P_IN)[:, None] & mask_m[None, :]
        parts = tl.load(sq_in_ptr + rp[:, None] * M + rm[None, :], mask=p_mask, other=0.0)
        rs = 1.0 / tl.sqrt(tl.sum(parts, axis=0) / K + eps)  # (BLOCK_M,)
        g = (acc.to(dt).to(tl.float32) * rs[:, None]).to(dt).to(tl.float32)
        u = (acc_up.to(dt).to(tl.float32) * rs[:, None]).to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        out = (s * u).to(dt)
    else:
        out = acc.to(dt)
    tl.store(y_ptrs, out, mask=mask)


@kernel
def _wide_gemm_kernel(
    x_ptr,  # (M, K) row stride stride_x: the input
    w_ptr,  # (N, K) contiguous rows; SILU: [gate rows | up rows], N = 2 * N_OUT
    y_ptr,  # (M, N_OUT) row stride stride_y: the output (RESIDUAL: the residual, updated in place)
    sq_in_ptr,  # SILU: (P_IN, M) float32 partial sums of squares of x's rows
    sq_out_ptr,  # SQ_OUT: (cdiv(N_OUT, BLOCK_N), M) float32 partial sums of squares of y's new rows
    ws_ptr,  # SPLIT_K > 1: (SPLIT_K, M, N_OUT * (2 if SILU)) float32 partial products
    counter_ptr,  # SPLIT_K > 1: (>= tiles,) int32 zeros, arrivals per output tile, left zeroed
    M,
    N_OUT,
    K,
    P_IN,
    stride_x,
    stride_y,
    eps,
    SILU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SQ_OUT: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % (SPLIT_K * BLOCK_K) == 0
    IEEE: tl.constexpr,  # fp32 products (no TF32)
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,  # the weight rows into L2 before the wait (PDL)
    P_BLOCK: tl.constexpr,  # next_pow2(P_IN)
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)  # row tiles vary fastest: neighbouring programs share a weight tile in L2
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_n = rn < N_OUT
    k_len = K // SPLIT_K  # SPLIT_K > 1 needs EVEN_K
    k_start = pid_k * k_len
    up_off = N_OUT.to(tl.int64) * K
    if PREFETCH and pid_m == 0:  # the weights do not depend on the launch before: asked for meanwhile
        rows = tl.where(mask_n, rn, 0).to(tl.int64)
        nbytes = (k_len * 2).to(tl.int32)
        _l2_prefetch(w_ptr + rows * K + k_start, nbytes)
        if SILU:
            _l2_prefetch(w_ptr + up_off + rows * K + k_start, nbytes)
    pdl.wait(PDL)  # x, the residual and the partial sums come from the launches before
    pdl.release(PDL)
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_x + (k_start + rk)[None, :]  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * K + (k_start + rk)[None, :]  # (BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # SILU only
    for k0 in range(k_start, k_start + k_len, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        else:
            mask_k = (k0 + rk) < K
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        if SILU:
            if EVEN_K:
                wu = tl.load(w_ptrs + up_off, mask=mask_n[:, None], other=0.0)
            else:
                wu = tl.load(w_ptrs + up_off, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            if IEEE:
                acc_up = tl.dot(x, tl.trans(wu), acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(x, tl.trans(wu), acc_up)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SPLIT_K == 1:
        _epilogue(acc, acc_up, rm, rn, mask_m, mask_n, pid_n, y_ptr, sq_in_ptr, sq_out_ptr, M, N_OUT, P_IN,
                  stride_y, eps, K, SILU, RESIDUAL, SQ_OUT, P_BLOCK)  # fmt: skip
    else:
        n_ws = N_OUT * 2 if SILU else N_OUT
        mask = mask_m[:, None] & mask_n[None, :]
        ws = ws_ptr + rm[:, None] * n_ws + rn[None, :]  # slice s at + s * M * n_ws
        tl.store(ws + pid_k * M * n_ws, acc, mask=mask)
        if SILU:
            tl.store(ws + pid_k * M * n_ws + N_OUT, acc_up, mask=mask)
        # release this slice; the program that arrives last sums every slice in order (deterministic)
        tile = pid_n * tl.num_programs(0) + pid_m
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            tl.store(counter_ptr + tile, 0)  # zeroed for the next launch
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(ws + s * M * n_ws, mask=mask, other=0.0, cache_modifier=".cg")
                if SILU:
                    acc_up += tl.load(ws + s * M * n_ws + N_OUT, mask=mask, other=0.0, cache_modifier=".cg")
            _epilogue(acc, acc_up, rm, rn, mask_m, mask_n, pid_n, y_ptr, sq_in_ptr, sq_out_ptr, M, N_OUT,
                      P_IN, stride_y, eps, K, SILU, RESIDUAL, SQ_OUT, P_BLOCK)  # fmt: skip


# H200, Qwen3-0.6B shapes, bf16, 28 layers' weights streamed, PDL and prefetch on (`python -m
# kernels.bench_wide --sweep`): (N, K, M bucket) -> config
TUNED: dict[tuple[int, int, int], WideConfig] = {}
INTERPRET_CONFIG = WideConfig(16, 16, 32, 4, 1)
PDL = True  # each launch starts while the one before runs and waits for it (kernels.pdl)
PREFETCH = True  # ... asking for its weight rows into L2 before the wait
MAX_TILES = 4096  # output tiles of one split-K launch (arrival counters)


def m_bucket(m: int) -> int:
    return max(16, next_pow2(m))


def choose_config(m: int, n: int, k: int) -> WideConfig:
    """The tile for a GEMM of (m, k) by n weight rows of k (SILU: n counts gate and up rows): TUNED, else
    split-K where the output tiles alone would leave most SMs idle."""
    cfg = TUNED.get((n, k, m_bucket(m)))
    if cfg is not None:
        return cfg
    block_m, block_n = min(64, m_bucket(m)), 32
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = 1
    while tiles * split < 128 and k % (2 * split * 128) == 0:
        split *= 2
    return WideConfig(block_m, block_n, 128, 4, 3, split)


def gemm(
    x: torch.Tensor,  # (M, K)
    weight: torch.Tensor,  # (N, K) contiguous
    *,
    residual: torch.Tensor | None = None,  # (M, N): residual += x @ W^T in place (returned)
    sq_out: bool = False,  # RESIDUAL: also return each tile's partial sums of squares of the new rows
    silu_scale: tuple[torch.Tensor, float] | None = None,  # (partial sums (P, M), eps): SILU epilogue
    config: WideConfig | None = None,
    use_pdl: bool | None = None,
    prefetch: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (y or residual, partial sums (P, M) float32 or None)
    """One projection of the wide tail: x @ W^T with the RESIDUAL, SILU or plain epilogue."""
    m, k = x.shape
    silu = silu_scale is not None
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    if weight.shape[1] != k or not weight.is_contiguous() or x.stride(-1) != 1:
        raise ValueError(f"wide gemm: x {tuple(x.shape)} and a contiguous weight (N, {k}) expected")
    interp = is_interpreting(x)
    cfg = config or (INTERPRET_CONFIG if interp else choose_config(m, weight.shape[0], k))
    split = cfg.split_k if k % (cfg.split_k * cfg.block_k) == 0 else 1
    on = (PDL and pdl.enabled(x.device)) if use_pdl is None else use_pdl
    pre = on and (PREFETCH if prefetch is None else prefetch) and not interp
    if residual is not None:
        if residual.shape != (m, n_out) or residual.stride(-1) != 1:
            raise ValueError(f"wide gemm: residual ({m}, {n_out}) expected, got {tuple(residual.shape)}")
        y = residual
    else:
        y = torch.empty(m, n_out, dtype=x.dtype, device=x.device)
    tiles_n, tiles_m = triton.cdiv(n_out, cfg.block_n), triton.cdiv(m, cfg.block_m)
    dummy = y
    ws = counters = dummy
    if split > 1:
        if tiles_m * tiles_n > MAX_TILES:
            raise ValueError(f"wide gemm: {tiles_m * tiles_n} output tiles, at most {MAX_TILES} with split-K")
        ws = torch.empty(split, m, n_out * (2 if silu else 1), dtype=torch.float32, device=x.device)
        counters = arrival_counters("wide_gemm", MAX_TILES, x.device)
    sq = torch.empty(tiles_n, m, dtype=torch.float32, device=x.device) if sq_out else None
    parts, eps = silu_scale if silu else (dummy, 0.0)
    _wide_gemm_kernel[(tiles_m, tiles_n, split)](
        x, weight, y, parts, sq if sq is not None else dummy, ws, counters,
        m, n_out, k, parts.shape[0] if silu else 0, x.stride(0), y.stride(0), eps,
        SILU=silu, RESIDUAL=residual is not None, SQ_OUT=sq is not None,
        EVEN_K=k % (split * cfg.block_k) == 0, IEEE=x.dtype == torch.float32, PDL=on, PREFETCH=pre,
        P_BLOCK=next_pow2(parts.shape[0]) if silu else 1, SPLIT_K=split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch_kwargs(on),
    )  # fmt: skip
    return y, sq


def folded_decode_layer_tail(
    a: torch.Tensor,  # (M, A): the attention output
    residual: torch.Tensor,  # (M, H), updated in place
    w,  # reference.TailWeights of a folded model (norm weights ones, no biases, a next layer)
    configs: dict[str, WideConfig] | None = None,  # per projection ("o", "gate_up", "down", "qkv")
    use_pdl: bool | None = None,
    prefetch: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (next qkv of the un-normalized residual (M, NQ), residual)
    """kernels.dispatch.folded_decode_layer_tail in four launches."""
    cfg = configs or {}
    kw = {"use_pdl": use_pdl, "prefetch": prefetch}
    _, sq = gemm(a, w.o, residual=residual, sq_out=True, config=cfg.get("o"), **kw)
    act, _ = gemm(residual, w.gate_up, silu_scale=(sq, w.eps2), config=cfg.get("gate_up"), **kw)
    gemm(act, w.down, residual=residual, config=cfg.get("down"), **kw)
    qkv, _ = gemm(residual, w.qkv_next, config=cfg.get("qkv"), **kw)
    return qkv, residual
