"""The tail of a decode layer for wide batches (reference.decode_layer_tail) in four GEMM launches.

At decode batches of ~16-256 rows each projection is a small GEMM (8-12 MB of weights, 0.5-3 GFLOP):
cuBLAS takes ~7 us a launch on the H200 whatever the batch, and the residual adds, RMSNorms and the
SiLU-and-mul between the projections are three more launches a layer. Here every projection is one
tensor-core GEMM (tiles of BLOCK_M rows x BLOCK_N weight rows, walking K) whose prologue and epilogue
do that elementwise work:

    h   = (a @ Wo^T + bo) + residual                  epilogue RESIDUAL; writes h and SQ_OUT
    act = silu(g) * u,  [g | u] = rms_norm(h) @ Wgu^T prologue NORM, epilogue SILU (gate and up
                                                       rows of one tile side by side)
    h2  = (act @ Wd^T + bd) + h                       epilogue RESIDUAL
    qkv = rms_norm(h2) @ Wqkv'^T                      prologue NORM (the next layer's input)

An RMSNorm needs the sum of squares of a whole row, and the GEMM that writes the row sees BLOCK_N
columns of it: its epilogue stores each tile's partial sums (SQ_OUT: (N / BLOCK_N, M) float32, no
atomics), and the next GEMM adds those few partials in a fixed order before its K loop
(deterministic). Rounding follows the unfused ops: fp32 accumulation, each projection output rounded to
the activation dtype once, then the residual add, the RMSNorm (normalized then weighted, rounded at
each step as reference.rms_norm) and silu(gate) * up rounded as reference.silu_and_mul.

A tile's K range may be cut in SPLIT_K slices (more programs in flight where N / BLOCK_N leaves SMs
idle): each slice stores its float32 partial products, and the program that ends a tile's last slice
(an arrival counter per tile, left zeroed) sums them in slice order and runs the epilogue.

`python -m kernels.bench_wide` times the four launches against the unfused path (cuBLAS and the
elementwise launches) over 28 layers in a CUDA graph, and sweeps the tile configs. Measured on the H200
(2026-11-30, us per layer, swept configs, best of with and without PDL): M=16 37.9 against 27.4
unfused, M=64 42.5 / 28.9, M=128 45.9 / 30.5, M=256 49.1 / 36.7; W2 22,915 tok/s with the default
tiles against 26,233 without. The GEMMs without a prologue (o, down) match or beat cuBLAS with split-K
(o at M=16: 5.19 against 5.96 us), but the two with the RMSNorm prologue (gate_up, qkv) take ~2x
cuBLAS's time: the normalized input is rebuilt in registers every K step before the dot, so its loads
are not staged ahead like the weights'. Hence kernels.dispatch.WIDE_TAIL is off.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import arrival_counters, is_interpreting, kernel, next_pow2
from kernels.reference import TailWeights


class WideConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1


@triton.jit
def _epilogue(
    acc, acc_up, rm, rn, mask_m, mask_n, pid_n, b_ptr, y_ptr, r_ptr, sq_out_ptr, M, N_OUT, stride_r,
    SILU: tl.constexpr, RESIDUAL: tl.constexpr, SQ_OUT: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """Bias, then SILU or RESIDUAL (with SQ_OUT), rounded as the unfused ops; stores the (BLOCK_M, BLOCK_N)
    tile of y."""
    dt = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if SILU:
            acc_up += tl.load(b_ptr + N_OUT + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SILU:  # gate_up rounded once, then as reference.silu_and_mul
        g = acc.to(dt).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        out = (silu * acc_up.to(dt).to(tl.float32)).to(dt)
    elif RESIDUAL:  # the projection rounded once, then `o + residual`
        r = tl.load(r_ptr + rm[:, None] * stride_r + rn[None, :], mask=mask, other=0.0)
        out = (acc.to(dt).to(tl.float32) + r.to(tl.float32)).to(dt)
        if SQ_OUT:  # columns past N_OUT hold zeros
            of = out.to(tl.float32)
            tl.store(sq_out_ptr + pid_n * M + rm, tl.sum(of * of, axis=1), mask=mask_m)
    else:
        out = acc.to(dt)
    tl.store(y_ptr + rm[:, None] * N_OUT + rn[None, :], out, mask=mask)


@kernel
def _wide_gemm_kernel(
    x_ptr,  # (M, K) row stride stride_x: the input (NORM: before the norm)
    w_ptr,  # (N, K) contiguous rows; SILU: [gate rows | up rows], N = 2 * N_OUT
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    y_ptr,  # (M, N_OUT) contiguous: the output
    r_ptr,  # (M, N_OUT) row stride stride_r: the residual added in the epilogue (RESIDUAL)
    sq_in_ptr,  # (P_IN, M) float32: partial sums of squares of x's rows (NORM)
    nw_ptr,  # (K,) RMSNorm weight (NORM)
    sq_out_ptr,  # (cdiv(N_OUT, BLOCK_N), M) float32: partial sums of squares of y's rows (SQ_OUT)
    ws_ptr,  # (SPLIT_K, M, N_OUT * (2 if SILU)) float32: each K slice's partial products (SPLIT_K > 1)
    counter_ptr,  # (>= tiles,) int32 zeros: arrivals per output tile (SPLIT_K > 1), left zeroed
    M,
    N_OUT,
    K,
    P_IN,
    stride_x,
    stride_r,
    eps,
    NORM: tl.constexpr,
    SILU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SQ_OUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % (SPLIT_K * BLOCK_K) == 0
    IEEE: tl.constexpr,  # fp32 products (no TF32)
    PDL: tl.constexpr,
    P_BLOCK: tl.constexpr,  # next_pow2(P_IN)
    SPLIT_K: tl.constexpr,  # K cut in SPLIT_K slices; the program that ends a tile's last slice sums them
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
    dt = y_ptr.dtype.element_ty
    k_len = K // SPLIT_K  # SPLIT_K > 1 needs EVEN_K
    k_start = pid_k * k_len
    pdl.wait(PDL)  # x, the residual and the partial sums come from the launches before
    pdl.release(PDL)
    if NORM:  # the partials in one (P_BLOCK, BLOCK_M) load: one round trip, not one per partial
        rp = tl.arange(0, P_BLOCK)
        p_mask = (rp < P_IN)[:, None] & mask_m[None, :]
        parts = tl.load(sq_in_ptr + rp[:, None] * M + rm[None, :], mask=p_mask, other=0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(parts, axis=0) / K + eps)  # (BLOCK_M,)
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_x + (k_start + rk)[None, :]  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * K + (k_start + rk)[None, :]  # (BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # SILU only
    up_off = N_OUT.to(tl.int64) * K
    for k0 in range(k_start, k_start + k_len, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        else:
            mask_k = (k0 + rk) < K
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if NORM:  # rounded as reference.rms_norm: normalized, then weighted
            if EVEN_K:
                nw = tl.load(nw_ptr + k0 + rk)
            else:
                nw = tl.load(nw_ptr + k0 + rk, mask=mask_k, other=0.0)
            hn = (x.to(tl.float32) * rstd[:, None]).to(dt)
            x = (nw.to(tl.float32)[None, :] * hn.to(tl.float32)).to(dt)
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
        _epilogue(acc, acc_up, rm, rn, mask_m, mask_n, pid_n, b_ptr, y_ptr, r_ptr, sq_out_ptr, M, N_OUT,
                  stride_r, SILU, RESIDUAL, SQ_OUT, HAS_BIAS)  # fmt: skip
    else:
        n_ws = N_OUT * 2 if SILU else N_OUT
        mask = mask_m[:, None] & mask_n[None, :]
        ws = ws_ptr + rm[:, None] * n_ws + rn[None, :]  # slice pid_k at + pid_k * M * n_ws
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
            _epilogue(acc, acc_up, rm, rn, mask_m, mask_n, pid_n, b_ptr, y_ptr, r_ptr, sq_out_ptr, M, N_OUT,
                      stride_r, SILU, RESIDUAL, SQ_OUT, HAS_BIAS)  # fmt: skip


class _Norm(NamedTuple):
    sq: torch.Tensor  # (P, M) float32 partial sums of squares of the input rows
    weight: torch.Tensor  # (K,)
    eps: float


# H200, Qwen3-0.6B shapes, bf16, 28 layers' weights streamed (`python -m kernels.bench_wide --sweep`,
# 2026-11-30): (N, K, M bucket) -> config; us per launch, cuBLAS's F.linear alone in brackets.
TUNED: dict[tuple[int, int, int], WideConfig] = {
    (1024, 2048, 16): WideConfig(16, 32, 128, 4, 3, 4),  # o M=16: 5.19 (5.96)
    (6144, 1024, 16): WideConfig(16, 32, 128, 4, 3, 4),  # gate_up M=16: 8.55 (6.22)
    (1024, 3072, 16): WideConfig(16, 32, 128, 4, 3, 8),  # down M=16: 6.29 (7.07)
    (4096, 1024, 16): WideConfig(16, 64, 128, 4, 3, 2),  # qkv M=16: 7.47 (5.36)
    (1024, 2048, 64): WideConfig(64, 32, 128, 4, 3, 4),  # o M=64: 6.65 (6.01)
    (6144, 1024, 64): WideConfig(32, 64, 128, 4, 3, 1),  # gate_up M=64: 13.51 (6.55)
    (1024, 3072, 64): WideConfig(64, 32, 128, 4, 3, 4),  # down M=64: 7.86 (7.53)
    (4096, 1024, 64): WideConfig(32, 32, 128, 4, 3, 1),  # qkv M=64: 10.06 (5.51)
    (1024, 2048, 128): WideConfig(64, 32, 128, 4, 3, 2),  # o M=128: 7.45 (6.53)
    (6144, 1024, 128): WideConfig(64, 32, 128, 4, 3, 1),  # gate_up M=128: 16.11 (6.67)
    (1024, 3072, 128): WideConfig(64, 32, 128, 4, 3, 2),  # down M=128: 9.35 (7.69)
    (4096, 1024, 128): WideConfig(64, 128, 128, 8, 3, 1),  # qkv M=128: 11.05 (5.59)
    (1024, 2048, 256): WideConfig(64, 64, 128, 4, 3, 2),  # o M=256: 8.63 (6.66)
    (6144, 1024, 256): WideConfig(64, 128, 128, 8, 3, 1),  # gate_up M=256: 15.57 (8.07)
    (1024, 3072, 256): WideConfig(64, 32, 128, 4, 3, 2),  # down M=256: 10.56 (7.99)
    (4096, 1024, 256): WideConfig(64, 128, 128, 8, 3, 1),  # qkv M=256: 11.33 (6.74)
}
INTERPRET_CONFIG = WideConfig(16, 16, 32, 4, 1)
PDL = False  # each launch starts early and waits for the one before (kernels.pdl)
MIN_M = 16  # batches the engine could send here (kernels.dispatch.WIDE_TAIL)
MAX_M = 256
MAX_TILES = 4096  # output tiles of one split-K launch (arrival counters)


def _m_bucket(m: int) -> int:
    return max(16, next_pow2(m))


def choose_config(m: int, n_out: int, k: int, silu: bool) -> WideConfig:
    """The tile for a GEMM writing (m, n_out) from (m, k): TUNED, else split-K where the output tiles
    alone would leave most SMs idle."""
    bucket = _m_bucket(m)
    cfg = TUNED.get((n_out * (2 if silu else 1), k, bucket))
    if cfg is not None:
        return cfg
    block_m, block_n = min(64, bucket), 32
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n_out, block_n)
    split = 1
    while tiles * split < 128 and k % (2 * split * 128) == 0:
        split *= 2
    return WideConfig(block_m, block_n, 128, 4, 3, split)


def _gemm(
    x: torch.Tensor,  # (M, K)
    weight: torch.Tensor,  # (N, K)
    bias: torch.Tensor | None,
    *,
    norm: _Norm | None = None,
    silu: bool = False,
    residual: torch.Tensor | None = None,  # (M, N): added in the epilogue
    config: WideConfig | None = None,
    use_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # y (M, N_OUT), partial sums of squares (P, M) or None
    m, k = x.shape
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    interp = is_interpreting(x)
    cfg = config or (INTERPRET_CONFIG if interp else choose_config(m, n_out, k, silu))
    split = cfg.split_k if k % (cfg.split_k * cfg.block_k) == 0 else 1
    y = torch.empty(m, n_out, dtype=x.dtype, device=x.device)
    tiles_n = triton.cdiv(n_out, cfg.block_n)
    tiles_m = triton.cdiv(m, cfg.block_m)
    if split > 1:
        ws = torch.empty(split, m, n_out * (2 if silu else 1), dtype=torch.float32, device=x.device)
        counters = arrival_counters("wide_tail", MAX_TILES, x.device)
        if tiles_m * tiles_n > MAX_TILES:
            raise ValueError(f"wide_tail: {tiles_m * tiles_n} output tiles, at most {MAX_TILES} with split-K")
    sq_out = torch.empty(tiles_n, m, dtype=torch.float32, device=x.device) if residual is not None else None
    dummy = y
    grid = (tiles_m, tiles_n, split)
    p_block = next_pow2(norm.sq.shape[0]) if norm is not None else 1
    _wide_gemm_kernel[grid](
        x, weight, bias if bias is not None else dummy, y,
        residual if residual is not None else dummy,
        norm.sq if norm is not None else dummy, norm.weight if norm is not None else dummy,
        sq_out if sq_out is not None else dummy, ws if split > 1 else dummy, counters if split > 1 else dummy,
        m, n_out, k, norm.sq.shape[0] if norm is not None else 0, x.stride(0),
        residual.stride(0) if residual is not None else 0, norm.eps if norm is not None else 0.0,
        NORM=norm is not None, SILU=silu, RESIDUAL=residual is not None, SQ_OUT=sq_out is not None,
        HAS_BIAS=bias is not None, EVEN_K=k % (split * cfg.block_k) == 0, IEEE=x.dtype == torch.float32,
        PDL=use_pdl, P_BLOCK=p_block, SPLIT_K=split, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch_kwargs(use_pdl),
    )  # fmt: skip
    return y, sq_out


def fits(m: int, dtype: torch.dtype, w: TailWeights) -> bool:
    """Whether decode_layer_tail takes a batch of m rows of dtype with these weights."""
    tensors = [w.o, w.o_bias, w.norm2, w.gate_up, w.gate_up_bias, w.down, w.down_bias, w.norm1_next,
               w.qkv_next, w.qkv_next_bias]  # fmt: skip
    weights_ok = all(t is None or (t.dtype == dtype and t.is_contiguous()) for t in tensors)
    return MIN_M <= m <= MAX_M and dtype in (torch.bfloat16, torch.float16) and weights_ok


def decode_layer_tail(
    a: torch.Tensor,  # (M, A): the attention output
    residual: torch.Tensor,  # (M, H)
    w: TailWeights,
    configs: dict[str, WideConfig] | None = None,  # per projection ("o", "gate_up", "down", "qkv")
    use_pdl: bool | None = None,  # programmatic dependent launch between the four (default: PDL)
) -> tuple[torch.Tensor, torch.Tensor]:  # (next layer's qkv (M, NQ) or the MLP output (M, H), residual)
    """reference.decode_layer_tail in four launches; returns new tensors (a and residual are kept)."""
    if a.dim() != 2 or residual.dim() != 2 or a.shape[0] != residual.shape[0]:
        shapes = f"{tuple(a.shape)}, {tuple(residual.shape)}"
        raise ValueError(f"a (M, A) and residual (M, H) expected, got {shapes}")
    if w.o.shape != (residual.shape[1], a.shape[1]) or w.gate_up.shape[1] != residual.shape[1]:
        raise ValueError("decode_layer_tail: inconsistent shapes")
    cfg = configs or {}
    on = (PDL and pdl.enabled(a.device)) if use_pdl is None else use_pdl
    a, residual = a.contiguous(), residual.contiguous()
    h, sq = _gemm(a, w.o, w.o_bias, residual=residual, config=cfg.get("o"), use_pdl=on)
    act, _ = _gemm(h, w.gate_up, w.gate_up_bias, norm=_Norm(sq, w.norm2, w.eps2), silu=True,
                   config=cfg.get("gate_up"), use_pdl=on)  # fmt: skip
    if w.qkv_next is None:
        y, _ = _gemm(act, w.down, w.down_bias, config=cfg.get("down"), use_pdl=on)
        return y, h
    h2, sq2 = _gemm(act, w.down, w.down_bias, residual=h, config=cfg.get("down"), use_pdl=on)
    qkv, _ = _gemm(h2, w.qkv_next, w.qkv_next_bias, norm=_Norm(sq2, w.norm1_next, w.eps1_next),
                   config=cfg.get("qkv"), use_pdl=on)  # fmt: skip
    return qkv, h2
