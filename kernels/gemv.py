"""y = x @ W^T (+ bias) for decode-sized batches: x (M, K) with M <= 64, W (N, K) (matches reference.linear).

At batch 1 a projection is a pure weight stream: every weight is read once and used once, so the kernel
must keep all SMs busy reading. cuBLAS picks tiles made for large M, well below the memory's rate on the
Qwen3-0.6B projections; these kernels split the rows of W over many small programs instead.

Two paths, chosen per call by `choose_config`:
- "fma" (M <= 8): each program owns BLOCK_N rows of W (contiguous in memory) and walks K in BLOCK_K
  steps, multiplying on the CUDA cores into a (BLOCK_M, BLOCK_N, BLOCK_K) fp32 accumulator that is
  summed over K once at the end. No tensor cores: at M <= 8 the math is free next to the bytes.
- "dot" (larger M): (BLOCK_M, BLOCK_K) x (BLOCK_K, BLOCK_N) tensor-core tiles; when N / BLOCK_N leaves
  SMs idle, K is split over SPLIT_K programs that write fp32 partials (SPLIT_K, M, N), and a second
  launch sums them (fixed order: deterministic), adds the bias and rounds once.
Accumulation is fp32 and the result is rounded to x's dtype once, as cuBLAS does.

The fma path also folds in what precedes a decode projection, so that one launch replaces two: SILU_MUL
(the down projection reads gate_up) and NORM (kernels.gemv_norm's `add_rms_norm_gemv`: the qkv and
gate_up projections read rms_norm(x + residual)). With NORM every program first walks x (+ residual)
once for the sums of squares (a few KB, from L2), then rebuilds the normalized input chunk by chunk in
its K loop, rounded exactly as reference.rms_norm rounds; program 0 writes x + residual to a new tensor.

A first layer's projection (kernels.gemv_norm's `embed_rms_norm_gemv`) also gathers its rows of x from
the embedding by token id (GATHER; program 0 writes them out as the residual stream). At batch 1 it
launches with programmatic dependent launch (PDL) after the step's input launch that writes the ids,
each program's whole weight slice read before it waits (PRELOAD: one chunk of K); it lets the next
launch start only after that wait, once the step's inputs are all written.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import is_interpreting, kernel, next_pow2


class GemvConfig(NamedTuple):
    path: str  # "fma" or "dot"
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


@kernel
def _gemv_fma_kernel(
    x_ptr,  # (M, K), row stride stride_x
    w_ptr,  # (N, K), row stride stride_w
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    y_ptr,  # (M, N), row stride stride_y
    r_ptr,  # (M, K) residual, row stride stride_r; unused unless HAS_RESIDUAL
    nw_ptr,  # (K,) RMSNorm weight; unused unless NORM
    r_out_ptr,  # (M, K) contiguous: x + residual (GATHER: the gathered rows), written by program 0
    ids_ptr,  # (M,) int64: with GATHER, row r of x is row ids[r] of x_ptr (an embedding table)
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    stride_r,
    eps,
    HAS_BIAS: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks on W
    SILU_MUL: tl.constexpr,  # x is a fused gate_up (M, 2K): multiply by silu(gate) * up (silu_and_mul)
    NORM: tl.constexpr,  # multiply by rms_norm(x (+ residual)) (reference.add_rms_norm_linear)
    HAS_RESIDUAL: tl.constexpr,
    NORM_BLOCK: tl.constexpr,  # K step of the sum-of-squares pass
    GATHER: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (kernels.pdl)
    PRELOAD: tl.constexpr,  # the program's weight slice is read before the PDL wait (BLOCK_K >= K, EVEN)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_n = rn < N
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * stride_w + rk[None, :]  # (BLOCK_N, BLOCK_K)
    if PRELOAD:  # the weights depend on no kernel before
        w_held = tl.load(w_ptrs)
    pdl.wait(PDL)  # x, the residual and the ids may come from the kernel before
    # the launches after this one read the step's inputs (lengths, positions, block tables) before their
    # own wait: they may start only once the launch that wrote those inputs has finished (kernels.pdl)
    pdl.release(PDL)
    if GATHER:
        xrow = tl.load(ids_ptr + rm, mask=mask_m, other=0)  # (BLOCK_M,) int64
    else:
        xrow = rm.to(tl.int64)
    if NORM:  # every program reads the rows of x once (a few KB from L2) for their sums of squares
        rs = tl.arange(0, NORM_BLOCK)
        sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, NORM_BLOCK):
            mask = mask_m[:, None] & ((k0 + rs) < K)[None, :]
            s = tl.load(x_ptr + xrow[:, None] * stride_x + (k0 + rs)[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:  # rounded to the activation dtype like torch's `x + residual`
                r = tl.load(r_ptr + rm[:, None] * stride_r + (k0 + rs)[None, :], mask=mask, other=0.0)
                s = (s.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                if pid == 0:  # into a separate buffer: the other programs still read the old residual
                    tl.store(r_out_ptr + rm[:, None] * K + (k0 + rs)[None, :], s, mask=mask)
            elif GATHER and pid == 0:  # the gathered rows are the residual stream
                tl.store(r_out_ptr + rm[:, None] * K + (k0 + rs)[None, :], s, mask=mask)
            sf = s.to(tl.float32)
            sum_sq += tl.sum(sf * sf, axis=1)
        rstd = 1.0 / tl.sqrt(sum_sq / K + eps)  # (BLOCK_M,)
        r_ptrs = r_ptr + rm[:, None] * stride_r + rk[None, :]  # (BLOCK_M, BLOCK_K)
    x_ptrs = x_ptr + xrow[:, None] * stride_x + rk[None, :]  # (BLOCK_M, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if PRELOAD:  # one chunk: the whole slice
            w = w_held
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        elif EVEN:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        else:
            mask_k = (k0 + rk) < K
            w = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        if NORM:  # h rebuilt chunk by chunk, rounded as reference.rms_norm rounds (and HF)
            if EVEN:
                nw = tl.load(nw_ptr + k0 + rk)
            else:
                nw = tl.load(nw_ptr + k0 + rk, mask=mask_k, other=0.0)
            if HAS_RESIDUAL:
                if EVEN:
                    r = tl.load(r_ptrs, mask=mask_m[:, None], other=0.0)
                else:
                    r = tl.load(r_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                r_ptrs += BLOCK_K
            h = (x.to(tl.float32) * rstd[:, None]).to(x_ptr.dtype.element_ty)
            x = (nw.to(tl.float32)[None, :] * h.to(tl.float32)).to(x_ptr.dtype.element_ty)
        if SILU_MUL:  # rounded as kernels.activation.silu_and_mul (and F.silu) round
            if EVEN:
                up = tl.load(x_ptrs + K, mask=mask_m[:, None], other=0.0).to(tl.float32)
            else:
                up = tl.load(x_ptrs + K, mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            g = x.to(tl.float32)
            silu = (g / (1.0 + tl.exp(-g))).to(x_ptr.dtype.element_ty).to(tl.float32)
            x = (silu * up).to(x_ptr.dtype.element_ty)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=2)  # (BLOCK_M, BLOCK_N)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_y + rn[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@kernel
def _gemm_dot_kernel(
    x_ptr,  # (M, K), row stride stride_x
    w_ptr,  # (N, K), row stride stride_w
    b_ptr,  # (N,) bias; unused unless HAS_BIAS (and SPLIT_K == 1)
    y_ptr,  # SPLIT_K == 1: (M, N) output, row stride stride_y; else (SPLIT_K, M, N) fp32 partials
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    k_per_split,  # multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % (SPLIT_K * BLOCK_K) == 0
    IEEE: tl.constexpr,  # fp32 inputs: full fp32 products, not tf32
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_n = rn < N
    k_start = pid_k * k_per_split
    w_ptrs = w_ptr + rn.to(tl.int64)[None, :] * stride_w + (k_start + rk)[:, None]  # (BLOCK_K, BLOCK_N)
    x_ptrs = x_ptr + rm[:, None] * stride_x + (k_start + rk)[None, :]  # (BLOCK_M, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        if EVEN:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        else:
            mask_k = (k0 + rk) < K
            w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rm[:, None] * stride_y + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        part = y_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :]
        tl.store(part, acc, mask=mask)


@kernel
def _split_k_reduce_kernel(
    part_ptr,  # (SPLIT_K, M, N) fp32
    b_ptr,  # (N,) bias; unused unless HAS_BIAS
    y_ptr,  # (M, N), row stride stride_y
    M,
    N,
    stride_y,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat index into (M, N)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + (offs // N) * stride_y + n, acc.to(y_ptr.dtype.element_ty), mask=mask)


# Tuned on the H200 (bf16, weights streamed from HBM, CUDA-graph replay; `python -m bench.kernels
# --sweep-gemv 1,2,4,8,16,32,64`): (N, K, BLOCK_M) -> config, for the Qwen3-0.6B projections qkv
# 4096x1024, o 1024x2048, gate_up 6144x1024, down 1024x3072. Other shapes use `_heuristic`.
TUNED: dict[tuple[int, int, int], GemvConfig] = {
    (4096, 1024, 1): GemvConfig("fma", 4, 512, 1, 2, 1),  # qkv M=1
    (1024, 2048, 1): GemvConfig("fma", 1, 1024, 1, 4, 1),  # o M=1
    (6144, 1024, 1): GemvConfig("fma", 4, 512, 1, 2, 1),  # gate_up M=1
    (1024, 3072, 1): GemvConfig("fma", 1, 1024, 1, 4, 1),  # down M=1
    (1024, 2048, 2): GemvConfig("fma", 2, 256, 1, 4, 1),  # o M=2
    (1024, 2048, 4): GemvConfig("fma", 2, 256, 1, 4, 1),  # o M=4
}
# Where the Triton kernel beats cuBLAS (same sweep): (N, K) -> the M it wins at. From M = 2 (M = 8 on the
# tensor-core path) up to 64, cuBLAS is as fast on these shapes, except o_proj at M <= 4, where cuBLAS's
# batch-1 kernel is slow. Shapes not listed: M = 1 only (the
# heuristic config beat cuBLAS on all four shapes at M = 1).
WINS_AT_M: dict[tuple[int, int], frozenset[int]] = {
    (1024, 2048): frozenset({1, 2, 3, 4}),
}
DEFAULT_WINS_AT_M = frozenset({1})

MAX_M = 64  # the launcher works beyond, but cuBLAS's large tiles are the better choice there
FMA_MAX_M = 8


def use_gemv(m: int, n: int, k: int) -> bool:
    """Whether dispatch.linear should take the Triton kernel for x (m, k) @ W (n, k)^T."""
    return m in WINS_AT_M.get((n, k), DEFAULT_WINS_AT_M)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def block_m_for(m: int) -> int:
    # fma: any power of two; dot: tensor-core tiles need >= 16 rows
    return next_pow2(m) if m <= FMA_MAX_M else max(16, next_pow2(m))


def _heuristic(m: int, n: int, k: int, sms: int) -> GemvConfig:
    if m <= FMA_MAX_M:
        block_k = min(512, next_pow2(k))
        block_k = max(32, block_k // block_m_for(m))  # keep the (M, N, K) accumulator in registers
        block_n = 8
        while block_n > 1 and triton.cdiv(n, block_n) < 4 * sms:  # several programs per SM in flight
            block_n //= 2
        return GemvConfig("fma", block_n, block_k, 1, 4, 1)
    block_n, block_k = 32, 128
    split = 1
    while triton.cdiv(n, block_n) * split * 2 <= 2 * sms and k % (split * 2 * block_k) == 0:
        split *= 2
    return GemvConfig("dot", block_n, block_k, split, 4, 3)


def choose_config(m: int, n: int, k: int, device: torch.device) -> GemvConfig:
    cfg = TUNED.get((n, k, block_m_for(m)))
    if cfg is not None:
        return cfg
    return _heuristic(m, n, k, _sm_count(device.index or 0) if device.type == "cuda" else 4)


def _checked_out(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, k_x: int
) -> torch.Tensor:  # (M, N): `out`, or a new tensor
    """Validates x (M, k_x), weight (N, K), bias (N,) and out (M, N)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != k_x:
        raise ValueError(f"x (M, K) and weight (N, K) expected, got {tuple(x.shape)}, {tuple(weight.shape)}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need a contiguous last dim")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} != x dtype {x.dtype}")
    m, n = x.shape[0], weight.shape[0]
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be contiguous ({n},), got {tuple(bias.shape)}")
    if out is None:
        return torch.empty((m, n), dtype=x.dtype, device=x.device)
    if out.shape != (m, n) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError("out must be (M, N) of x's dtype with a contiguous last dim")
    return out


def _config(x: torch.Tensor, n: int, k: int, config: GemvConfig | None) -> GemvConfig:
    cfg = config or choose_config(x.shape[0], n, k, x.device)
    if is_interpreting(x) and config is None:  # small tiles keep the interpreter fast
        cfg = cfg._replace(block_n=min(cfg.block_n, 16), block_k=min(cfg.block_k, 64))
    return cfg


def gemv(
    x: torch.Tensor,  # (M, K)
    weight: torch.Tensor,  # (N, K), same dtype as x
    bias: torch.Tensor | None = None,  # (N,)
    config: GemvConfig | None = None,
    out: torch.Tensor | None = None,  # (M, N) of x's dtype
    silu_mul: bool = False,  # x is a fused gate_up (M, 2K): computes silu_and_mul(x) @ W^T
) -> torch.Tensor:  # (M, N)
    if silu_mul:
        if x.dim() != 2 or x.shape[1] != 2 * weight.shape[-1]:
            raise ValueError(f"silu_mul: x must be (M, 2K) for weight (N, K), got {tuple(x.shape)}")
        cfg = config or choose_config(x.shape[0], weight.shape[0], weight.shape[1], x.device)
        if cfg.path != "fma":  # the tensor-core path reads x tiles as they are: activate first
            from kernels.activation import silu_and_mul

            return gemv(silu_and_mul(x), weight, bias, config, out)
    out = _checked_out(x, weight, bias, out, weight.shape[-1] * (2 if silu_mul else 1))
    m = x.shape[0]
    n, k = weight.shape
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(out))
    cfg = _config(x, n, k, config)
    b = bias if bias is not None else weight  # a dummy pointer when HAS_BIAS is off
    has_bias = bias is not None
    if cfg.path == "fma":
        even = n % cfg.block_n == 0 and k % cfg.block_k == 0
        _gemv_fma_kernel[(triton.cdiv(n, cfg.block_n),)](
            x, weight, b, out, weight, weight, weight, weight, m, n, k, x.stride(0), weight.stride(0),
            out.stride(0), 0, 0.0,
            HAS_BIAS=has_bias, EVEN=even, SILU_MUL=silu_mul, NORM=False, HAS_RESIDUAL=False, NORM_BLOCK=1,
            GATHER=False, PDL=False, PRELOAD=False,
            BLOCK_M=next_pow2(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return out
    block_m = max(16, next_pow2(m))
    split = max(1, cfg.split_k)
    k_per_split = triton.cdiv(triton.cdiv(k, split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # no empty splits
    even = n % cfg.block_n == 0 and k % k_per_split == 0
    dst = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _gemm_dot_kernel[(triton.cdiv(n, cfg.block_n), split)](
        x, weight, b, dst, m, n, k, x.stride(0), weight.stride(0), out.stride(0), k_per_split,
        HAS_BIAS=has_bias, EVEN=even, IEEE=x.dtype == torch.float32, SPLIT_K=split, BLOCK_M=block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        block = 1024 if not is_interpreting(x) else 256
        _split_k_reduce_kernel[(triton.cdiv(m * n, block),)](
            dst, b, out, m, n, out.stride(0), HAS_BIAS=has_bias, SPLIT_K=split, BLOCK=block, num_warps=4
        )
    return out
